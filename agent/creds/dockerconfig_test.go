package creds

import (
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The kubelet decodes an entry's auth as padded base64 when it ends in
// "=", and as unpadded (raw) base64 otherwise. Secrets written by tools
// that strip the padding must work here too, and one entry that cannot be
// decoded must not take the others down with it.
func TestDockerConfigAuthDecodesLikeTheKubelet(t *testing.T) {
	padded := base64.StdEncoding.EncodeToString([]byte("u1:pw1"))   // "dTE6cHcx" needs no padding
	padded2 := base64.StdEncoding.EncodeToString([]byte("u22:pw2")) // ends in "="
	raw := base64.RawStdEncoding.EncodeToString([]byte("u22:pw2"))  // the same, "=" stripped
	if !strings.HasSuffix(padded2, "=") || strings.HasSuffix(raw, "=") {
		t.Fatalf("fixtures: %q %q", padded2, raw)
	}
	tests := []struct {
		name      string
		entries   string
		want      map[string]string // key -> user:password
		wantErrOn string            // a key named in the error, or empty for no error
	}{
		{name: "padded", entries: `"a.example.com":{"auth":"` + padded2 + `"}`, want: map[string]string{"a.example.com": "u22:pw2"}},
		{name: "no padding needed", entries: `"a.example.com":{"auth":"` + padded + `"}`, want: map[string]string{"a.example.com": "u1:pw1"}},
		{name: "unpadded", entries: `"a.example.com":{"auth":"` + raw + `"}`, want: map[string]string{"a.example.com": "u22:pw2"}},
		{name: "surrounding blanks of padded", entries: `"a.example.com":{"auth":"` + padded2 + ` "}`, want: map[string]string{}, wantErrOn: "a.example.com"},
		{
			name:      "a bad entry keeps the others",
			entries:   `"a.example.com":{"auth":"` + raw + `"},"bad.example.com":{"auth":"!!!"},"c.example.com":{"username":"c","password":"x"},"nocolon.example.com":{"auth":"` + base64.StdEncoding.EncodeToString([]byte("nocolon")) + `"}`,
			want:      map[string]string{"a.example.com": "u22:pw2", "c.example.com": "c:x"},
			wantErrOn: "bad.example.com",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, doc := range []string{`{"auths":{` + tt.entries + `}}`, `{` + tt.entries + `}`} {
				got, err := ParseDockerConfig([]byte(doc))
				if (err != nil) != (tt.wantErrOn != "") || err != nil && !strings.Contains(err.Error(), tt.wantErrOn) {
					t.Errorf("%s: err %v, want one naming %q", doc, err, tt.wantErrOn)
				}
				if len(got) != len(tt.want) {
					t.Errorf("%s: %d entries %v, want %v", doc, len(got), got, tt.want)
				}
				for key, up := range tt.want {
					if c := got[key]; c.Username+":"+c.Password != up {
						t.Errorf("%s: %s = %v, want %s", doc, key, c, up)
					}
				}
			}
		})
	}
}

// A pull secret with one broken entry still adds its good entries, and the
// error names the bad one without quoting any secret.
func TestLoadDockerConfigKeepsGoodEntries(t *testing.T) {
	dir := t.TempDir()
	raw := base64.RawStdEncoding.EncodeToString([]byte("u22:pw2"))
	doc := `{"auths":{"a.example.com":{"auth":"` + raw + `"},"b.example.com":{"auth":"hunter2!"}}}`
	if err := os.WriteFile(filepath.Join(dir, DockerConfigJSONKey), []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	var k Keyring
	err := LoadDockerConfig(&k, dir)
	if err == nil || !strings.Contains(err.Error(), "b.example.com") || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("err %v, want one naming b.example.com without its content", err)
	}
	if got := users(k.Lookup("a.example.com/x:1")); got != "u22" {
		t.Errorf("a.example.com: users %q, want u22", got)
	}
}
