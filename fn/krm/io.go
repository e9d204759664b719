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
	rl, err := fn.ParseResourceList(in)
	if err != nil {
		return nil, nil, fmt.Errorf("read ResourceList: %w", err)
	}
	// Remember which yaml node each input item is, to recognize it on the
	// way out. The KubeObject is rebuilt around the same node.
	inputIndex := make(map[*yaml.Node]int, len(rl.Items))
	for i, ko := range rl.Items {
		rn := ko.MoveToResourceNode()
		inputIndex[rn.YNode()] = i
		rl.Items[i] = fn.MoveToKubeObject(rn)
	}
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
	encoded, err := encode(items, fc, rl.Results)
	if err != nil {
		return nil, rl.Results, fmt.Errorf("write ResourceList: %w", err)
	}
	if spliced, ok := splice(in, items, inputIndex, fc, rl.Results, encoded); ok {
		return spliced, rl.Results, nil
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
// the spliced output must parse to the same document as the encoded one.
func splice(in []byte, items []*yaml.Node, inputIndex map[*yaml.Node]int, fc *yaml.Node, results fn.Results, encoded []byte) ([]byte, bool) {
	spans, indent, ok := itemSpans(in, len(inputIndex))
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
	if !sameDocument(b.Bytes(), encoded) {
		return nil, false
	}
	return b.Bytes(), true
}

// sameDocument reports whether a and b parse to documents that encode
// identically: same data, same comments.
func sameDocument(a, b []byte) bool {
	ca, errA := canonical(a)
	cb, errB := canonical(b)
	return errA == nil && errB == nil && bytes.Equal(ca, cb)
}

func canonical(in []byte) ([]byte, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(in, &doc); err != nil {
		return nil, err
	}
	return encodeNode(&doc)
}

// itemSpans cuts the text of a block-style "items:" sequence into one chunk
// per item. A chunk starts with the comment lines right above the item's
// "-" and runs to the next chunk. It returns the column of the "-".
func itemSpans(in []byte, n int) ([][]byte, int, bool) {
	var doc yaml.Node
	if err := yaml.Unmarshal(in, &doc); err != nil || len(doc.Content) != 1 {
		return nil, 0, false
	}
	root := doc.Content[0]
	var key, seq *yaml.Node
	for i := 0; i+1 < len(root.Content); i += 2 {
		if root.Content[i].Value == "items" {
			key, seq = root.Content[i], root.Content[i+1]
		}
	}
	if seq == nil || seq.Kind != yaml.SequenceNode || seq.Style&yaml.FlowStyle != 0 || len(seq.Content) != n || n == 0 {
		return nil, 0, false
	}
	lines := bytes.SplitAfter(in, []byte("\n"))
	if len(lines[len(lines)-1]) == 0 {
		lines = lines[:len(lines)-1]
	}
	dashCol := seq.Column - 1
	isDash := func(l int) bool {
		line := lines[l]
		return len(line) > dashCol && line[dashCol] == '-' && len(bytes.TrimLeft(line[:dashCol], " ")) == 0 &&
			(len(line) == dashCol+1 || line[dashCol+1] == ' ' || line[dashCol+1] == '\n' || line[dashCol+1] == '\r')
	}
	isComment := func(l int) bool {
		t := bytes.TrimLeft(lines[l], " ")
		return len(t) > 0 && t[0] == '#'
	}
	isBlank := func(l int) bool { return len(bytes.TrimSpace(lines[l])) == 0 }

	starts := make([]int, n)
	floor := key.Line - 1 // the "items:" line, 0-based; chunks start below it
	if key.Column != 1 || seq.Line <= key.Line {
		return nil, 0, false
	}
	for i, item := range seq.Content {
		if item.Kind != yaml.MappingNode || item.Style&yaml.FlowStyle != 0 {
			return nil, 0, false
		}
		// The "-" is on the line of the first key, or alone above it.
		d := item.Line - 1
		for d > floor && !isDash(d) {
			d--
		}
		if d <= floor || (i > 0 && d <= starts[i-1]) {
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
		line := lines[l]
		if isBlank(l) || isComment(l) {
			continue
		}
		if len(line)-len(bytes.TrimLeft(line, " ")) <= dashCol {
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
		b.WriteString(ref.Name)
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
