# failures.awk reads `go test` output and prints each failed test with the
# last lines it logged, the error among them: `make test` ends with this,
# where a CI log's tail shows why a test failed, not only which.
#
# With -v, a test's lines follow `=== RUN|CONT|NAME  <test>` headers (the
# lines of parallel tests interleave under them) and come before its
# `--- FAIL`; without -v they come after it, indented.
BEGIN { if (keep == "") keep = 30 }
/^=== (RUN|CONT|NAME|PAUSE) / { cur = $3; after = 0; next }
/^ *--- (PASS|SKIP)/ { after = 0; next }
/^ *--- FAIL: / {
	print
	name = $3
	for (i = 1; i <= n[name]; i++) print "    | " buf[name, i]
	forget(name)
	after = 1
	next
}
/^(FAIL|ok|panic:)/ { if ($1 != "ok") print; cur = ""; after = 0; next }
after && /^ / { print "    | " $0; next }
cur != "" { remember(cur, $0) }

# remember keeps test t's last `keep` lines.
function remember(t, line,    i) {
	if (n[t] == keep) {
		for (i = 1; i < keep; i++) buf[t, i] = buf[t, i + 1]
		n[t]--
	}
	buf[t, ++n[t]] = line
}

function forget(t,    i) {
	for (i = 1; i <= n[t]; i++) delete buf[t, i]
	n[t] = 0
}
