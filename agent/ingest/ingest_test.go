package ingest

import (
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
)

// encodeStatus encodes a containerd content Status as containerd sends it, with
// started_at and expected set too (fields decodeStatus skips).
func encodeStatus(ref string, offset, total int64, updated time.Time) []byte {
	var ts []byte
	ts = protowire.AppendTag(ts, 1, protowire.VarintType)
	ts = protowire.AppendVarint(ts, uint64(updated.Unix()))
	ts = protowire.AppendTag(ts, 2, protowire.VarintType)
	ts = protowire.AppendVarint(ts, uint64(updated.Nanosecond()))
	var b []byte
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendBytes(b, ts)
	b = protowire.AppendTag(b, 2, protowire.BytesType)
	b = protowire.AppendBytes(b, ts)
	b = protowire.AppendTag(b, 3, protowire.BytesType)
	b = protowire.AppendString(b, ref)
	b = protowire.AppendTag(b, 4, protowire.VarintType)
	b = protowire.AppendVarint(b, uint64(offset))
	b = protowire.AppendTag(b, 5, protowire.VarintType)
	b = protowire.AppendVarint(b, uint64(total))
	b = protowire.AppendTag(b, 6, protowire.BytesType)
	b = protowire.AppendString(b, "sha256:expected")
	return b
}

func list(statuses ...[]byte) []byte {
	var b []byte
	for _, s := range statuses {
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendBytes(b, s)
	}
	return b
}

func TestDecodeList(t *testing.T) {
	at := time.Unix(1700000000, 5)
	cases := []struct {
		name    string
		in      []byte
		want    []Status
		wantErr bool
	}{
		{name: "no ingest", in: nil},
		{name: "two ingests", in: list(encodeStatus("layer-sha256:aa", 6<<20, 16<<20, at), encodeStatus("manifest-sha256:bb", 0, 0, at)),
			want: []Status{{Ref: "layer-sha256:aa", Offset: 6 << 20, Total: 16 << 20, UpdatedAt: at}, {Ref: "manifest-sha256:bb", UpdatedAt: at}}},
		{name: "truncated", in: list(encodeStatus("layer-sha256:aa", 1, 2, at))[:10], wantErr: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := decodeList(c.in)
			if (err != nil) != c.wantErr {
				t.Fatalf("err = %v, want error: %v", err, c.wantErr)
			}
			if c.wantErr {
				return
			}
			if len(got) != len(c.want) {
				t.Fatalf("got %+v, want %+v", got, c.want)
			}
			for i := range got {
				if got[i].Ref != c.want[i].Ref || got[i].Offset != c.want[i].Offset || got[i].Total != c.want[i].Total || !got[i].UpdatedAt.Equal(c.want[i].UpdatedAt) {
					t.Errorf("status %d = %+v, want %+v", i, got[i], c.want[i])
				}
			}
		})
	}
}
