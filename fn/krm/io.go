package krm

import (
	"bytes"
	"fmt"
	"strings"

	"github.com/kptdev/krm-functions-sdk/go/fn"
	"sigs.k8s.io/kustomize/kyaml/kio"
	"sigs.k8s.io/kustomize/kyaml/yaml"
)

// Run reads a ResourceList, runs the Processor and writes the result.
//
// It does not use fn.Run/fn.AsMain for the output: the SDK sorts items by
// apiVersion, kind, namespace and name and re-encodes every one of them,
// which reorders and reformats items this function must pass through
// untouched. Here items keep their order, and an item that passes through
// is copied from the input text byte for byte (see splice).
func Run(in []byte) ([]byte, fn.Results, error) {
	out, results, _, err := RunInvoked(in)
	return out, results, err
}

// RunInvoked is Run that also tells which tool invoked the function, for
// the caller to decide where results are shown.
func RunInvoked(in []byte) ([]byte, fn.Results, Invoker, error) {
	rl, err := fn.ParseResourceList(in)
	if err != nil {
		return nil, nil, Kustomize, fmt.Errorf("read ResourceList: %w", err)
	}
	// Remember which yaml node each input item is, to recognize it on the
	// way out. The KubeObject is rebuilt around the same node.
	inputIndex := make(map[*yaml.Node]int, len(rl.Items))
	for i, ko := range rl.Items {
		rn := ko.MoveToResourceNode()
		inputIndex[rn.YNode()] = i
		rl.Items[i] = fn.MoveToKubeObject(rn)
	}
	by := invokedByList(rl)
	out, results, err := finish(in, rl, inputIndex)
	return out, results, by, err
}

func finish(in []byte, rl *fn.ResourceList, inputIndex map[*yaml.Node]int) ([]byte, fn.Results, error) {
	if _, err := Processor.Process(rl); err != nil {
		return nil, nil, fmt.Errorf("process: %w", err)
	}
	items := make([]*yaml.Node, len(rl.Items))
	for i, ko := range rl.Items {
		items[i] = ko.MoveToResourceNode().YNode()
	}
	var fc *yaml.Node
	if rl.FunctionConfig != nil && !rl.FunctionConfig.IsEmpty() {
		fc = rl.FunctionConfig.CopyToResourceNode().YNode()
	}
	if spliced, ok := splice(in, items, inputIndex, fc, rl.Results); ok {
		return spliced, rl.Results, nil
	}
	encoded, err := encode(items, fc, rl.Results)
	if err != nil {
		return nil, rl.Results, fmt.Errorf("write ResourceList: %w", err)
	}
	return encoded, rl.Results, nil
}

// encode writes the ResourceList with kyaml's encoder, the one kpt and
// kustomize use for their input: canonical input comes back unchanged.
func encode(items []*yaml.Node, fc *yaml.Node, results fn.Results) ([]byte, error) {
	root, err := tail(fc, results)
	if err != nil {
		return nil, err
	}
	seq := &yaml.Node{Kind: yaml.SequenceNode, Tag: yaml.NodeTagSeq, Content: items}
	if len(items) == 0 {
		seq.Style = yaml.FlowStyle
	}
	root.Content = append([]*yaml.Node{
		{Kind: yaml.ScalarNode, Tag: yaml.NodeTagString, Value: "apiVersion"},
		{Kind: yaml.ScalarNode, Tag: yaml.NodeTagString, Value: kio.ResourceListAPIVersion},
		{Kind: yaml.ScalarNode, Tag: yaml.NodeTagString, Value: "kind"},
		{Kind: yaml.ScalarNode, Tag: yaml.NodeTagString, Value: kio.ResourceListKind},
		{Kind: yaml.ScalarNode, Tag: yaml.NodeTagString, Value: "items"},
		seq,
	}, root.Content...)
	return encodeNode(root)
}

// tail is the part of the ResourceList after the items.
func tail(fc *yaml.Node, results fn.Results) (*yaml.Node, error) {
	root := &yaml.Node{Kind: yaml.MappingNode, Tag: yaml.NodeTagMap}
	if fc != nil {
		root.Content = append(root.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: yaml.NodeTagString, Value: "functionConfig"}, fc)
	}
	if len(results) > 0 {
		b, err := yaml.Marshal(results)
		if err != nil {
			return nil, fmt.Errorf("marshal results: %w", err)
		}
		res, err := yaml.Parse(string(b))
		if err != nil {
			return nil, fmt.Errorf("re-read results: %w", err)
		}
		root.Content = append(root.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: yaml.NodeTagString, Value: "results"}, res.YNode())
	}
	return root, nil
}

func encodeNode(n *yaml.Node) ([]byte, error) {
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	if err := enc.Encode(n); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// splice builds the output from the input text: every item that passes
// through keeps its exact bytes, comments and formatting included; new
// items are encoded at the input's indentation. It gives up (false) on
// anything it cannot map to text with certainty, and it checks its result:
// the spliced output must parse back to exactly the items, functionConfig
// and results it was built from, comments included.
func splice(in []byte, items []*yaml.Node, inputIndex map[*yaml.Node]int, fc *yaml.Node, results fn.Results) ([]byte, bool) {
	inputs := make([]*yaml.Node, len(inputIndex))
	for n, i := range inputIndex {
		inputs[i] = n
	}
	spans, indent, ok := itemSpans(in, inputs)
	if !ok || len(items) == 0 {
		return nil, false
	}
	var b bytes.Buffer
	b.WriteString("apiVersion: " + kio.ResourceListAPIVersion + "\nkind: " + kio.ResourceListKind + "\nitems:\n")
	pad := strings.Repeat(" ", indent)
	for _, n := range items {
		if i, ok := inputIndex[n]; ok {
			b.Write(spans[i])
			continue
		}
		text, err := encodeNode(&yaml.Node{Kind: yaml.SequenceNode, Tag: yaml.NodeTagSeq, Content: []*yaml.Node{n}})
		if err != nil {
			return nil, false
		}
		for _, line := range strings.SplitAfter(string(text), "\n") {
			if line != "" {
				b.WriteString(pad + line)
			}
		}
	}
	rest, err := tail(fc, results)
	if err != nil {
		return nil, false
	}
	if len(rest.Content) > 0 {
		text, err := encodeNode(rest)
		if err != nil {
			return nil, false
		}
		b.Write(text)
	}
	if !parsesTo(b.Bytes(), items, rest) {
		return nil, false
	}
	return b.Bytes(), true
}

// parsesTo reports whether text is a ResourceList whose items are items and
// whose other fields are those of rest.
func parsesTo(text []byte, items []*yaml.Node, rest *yaml.Node) bool {
	var doc yaml.Node
	if err := yaml.Unmarshal(text, &doc); err != nil || len(doc.Content) != 1 {
		return false
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode || len(root.Content) != 6+len(rest.Content) {
		return false
	}
	seq := root.Content[5]
	if root.Content[4].Value != "items" || seq.Kind != yaml.SequenceNode || len(seq.Content) != len(items) {
		return false
	}
	for i := range items {
		if !sameNode(seq.Content[i], items[i]) {
			return false
		}
	}
	for i, n := range rest.Content {
		if !sameNode(root.Content[6+i], n) {
			return false
		}
	}
	return true
}

// sameNode compares data and comments, not presentation (quoting, flow
// or block style, indentation).
func sameNode(a, b *yaml.Node) bool {
	if a.Kind != b.Kind || len(a.Content) != len(b.Content) ||
		strings.TrimSpace(a.HeadComment) != strings.TrimSpace(b.HeadComment) ||
		strings.TrimSpace(a.LineComment) != strings.TrimSpace(b.LineComment) ||
		strings.TrimSpace(a.FootComment) != strings.TrimSpace(b.FootComment) {
		return false
	}
	switch a.Kind {
	case yaml.ScalarNode:
		return a.Value == b.Value && a.ShortTag() == b.ShortTag()
	case yaml.AliasNode:
		return a.Alias != nil && b.Alias != nil && a.Alias.Anchor == b.Alias.Anchor
	}
	for i := range a.Content {
		if !sameNode(a.Content[i], b.Content[i]) {
			return false
		}
	}
	return true
}

// itemSpans cuts the text of a block-style "items:" sequence into one chunk
// per item, using the positions the parser recorded on the item nodes. A
// chunk starts with the comment lines right above the item's "-" and runs
// to the next chunk. It also returns the column of the "-".
func itemSpans(in []byte, items []*yaml.Node) ([][]byte, int, bool) {
	n := len(items)
	if n == 0 {
		return nil, 0, false
	}
	lines := bytes.SplitAfter(in, []byte("\n"))
	if len(lines[len(lines)-1]) == 0 {
		lines = lines[:len(lines)-1]
	}
	isComment := func(l int) bool {
		t := bytes.TrimLeft(lines[l], " ")
		return len(t) > 0 && t[0] == '#'
	}
	isBlank := func(l int) bool { return len(bytes.TrimSpace(lines[l])) == 0 }

	// The "items:" key: the last top-level line above the first item.
	first := items[0]
	if first.Kind != yaml.MappingNode || first.Line < 2 || first.Line > len(lines) {
		return nil, 0, false
	}
	floor := -1
	for l := first.Line - 2; l >= 0; l-- {
		if bytes.HasPrefix(lines[l], []byte("items:")) {
			floor = l
			break
		}
		if !isBlank(l) && indentOf(lines[l]) == 0 && !isComment(l) {
			return nil, 0, false
		}
	}
	if floor < 0 {
		return nil, 0, false
	}
	// The "-" of the first entry fixes the column of every entry.
	dashCol := -1
	for l := first.Line - 1; l > floor; l-- {
		line := lines[l]
		if l == first.Line-1 {
			c := first.Column - 1
			if c >= 2 && c <= len(line) && bytes.Equal(line[c-2:c], []byte("- ")) && indentOf(line) == c-2 {
				dashCol = c - 2
				break
			}
			continue
		}
		if t := bytes.TrimSpace(line); bytes.Equal(t, []byte("-")) {
			dashCol = indentOf(line)
			break
		}
		if !isBlank(l) && !isComment(l) {
			return nil, 0, false
		}
	}
	if dashCol < 0 {
		return nil, 0, false
	}
	isDash := func(l int) bool {
		line := lines[l]
		return len(line) > dashCol && line[dashCol] == '-' && indentOf(line) == dashCol &&
			(len(line) == dashCol+1 || line[dashCol+1] == ' ' || line[dashCol+1] == '\n' || line[dashCol+1] == '\r')
	}

	starts := make([]int, n)
	for i, item := range items {
		if item.Kind != yaml.MappingNode || item.Style&yaml.FlowStyle != 0 || item.Line < 1 || item.Line > len(lines) {
			return nil, 0, false
		}
		// The "-" is on the line of the first key, or alone above it.
		d := item.Line - 1
		for d > floor && !isDash(d) {
			d--
		}
		if d <= floor {
			return nil, 0, false
		}
		s := d
		for s-1 > floor && (isComment(s-1) || isBlank(s-1)) {
			s--
		}
		// Leading blank lines stay with the previous chunk.
		for s < d && isBlank(s) {
			s++
		}
		starts[i] = s
		floor = d
	}
	// The sequence ends at the first line, after the last "-", that starts
	// at or left of the "-" and is neither a comment nor another entry.
	end := len(lines)
	for l := floor + 1; l < len(lines); l++ {
		if isBlank(l) || isComment(l) {
			continue
		}
		if indentOf(lines[l]) <= dashCol {
			end = l
			break
		}
	}
	// Comments between the last item and what follows belong to what follows.
	for end > floor+1 && isComment(end-1) && indentOf(lines[end-1]) <= dashCol {
		end--
	}
	spans := make([][]byte, n)
	for i := range starts {
		stop := end
		if i+1 < n {
			stop = starts[i+1]
		}
		chunk := bytes.Join(lines[starts[i]:stop], nil)
		if !bytes.HasSuffix(chunk, []byte("\n")) {
			chunk = append(chunk, '\n')
		}
		spans[i] = chunk
	}
	return spans, dashCol, true
}

func indentOf(line []byte) int { return len(line) - len(bytes.TrimLeft(line, " ")) }

// Describe is the one-line, human-readable form of a result, for stderr:
// kustomize shows a failing function's stderr and nothing else.
func Describe(r *fn.Result) string {
	var b strings.Builder
	b.WriteString(string(r.Severity))
	b.WriteString(": ")
	if ref := r.ResourceRef; ref != nil {
		b.WriteString(ref.Kind)
		b.WriteString(" ")
		if ref.Namespace != "" {
			b.WriteString(ref.Namespace + "/")
		}
		b.WriteString(cmpOr(ref.Name, "(no name)"))
		if r.File != nil && r.File.Path != "" {
			fmt.Fprintf(&b, " (%s)", r.File.Path)
		}
		b.WriteString(": ")
	}
	if r.Field != nil && r.Field.Path != "" {
		b.WriteString(r.Field.Path + ": ")
	}
	b.WriteString(strings.ReplaceAll(r.Message, "\n", " "))
	return b.String()
}
