package v1alpha1

import "testing"

func TestParsePinBudget(t *testing.T) {
	tests := []struct {
		in         string
		wantErr    bool
		wantString string
		capacity   uint64
		wantBytes  uint64
	}{
		{in: "25%", wantString: "25%", capacity: 1000, wantBytes: 250},
		{in: "0%", wantString: "0%", capacity: 1000, wantBytes: 0},
		{in: "100%", wantString: "100%", capacity: 1000, wantBytes: 1000},
		{in: "20Gi", wantString: "20Gi", capacity: 1, wantBytes: 20 << 30},
		{in: "500M", wantString: "500M", wantBytes: 500e6},
		{in: "2048Mi", wantString: "2Gi", wantBytes: 2 << 30},
		{in: "0", wantString: "0", wantBytes: 0},
		{in: "101%", wantErr: true},
		{in: "-1%", wantErr: true},
		{in: "2.5%", wantErr: true},
		{in: "-1Gi", wantErr: true},
		{in: "0.5", wantErr: true},
		{in: "lots", wantErr: true},
		{in: "", wantErr: true},
	}
	for _, tt := range tests {
		b, err := ParsePinBudget(tt.in)
		if (err != nil) != tt.wantErr {
			t.Errorf("ParsePinBudget(%q) error = %v, want error: %v", tt.in, err, tt.wantErr)
			continue
		}
		if err != nil {
			continue
		}
		if b.String() != tt.wantString || b.Of(tt.capacity) != tt.wantBytes {
			t.Errorf("ParsePinBudget(%q) = %q, %d bytes of %d; want %q, %d", tt.in, b.String(), b.Of(tt.capacity), tt.capacity, tt.wantString, tt.wantBytes)
		}
	}
}
