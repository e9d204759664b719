package v1alpha1

import (
	"fmt"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
)

// PinBudget is a parsed spec.pin.budget (the agent's --pin-budget): a share
// of the image filesystem's capacity, or a number of bytes.
type PinBudget struct {
	// IsShare: Percent (0 to 100) of the capacity; otherwise Bytes.
	Percent int
	IsShare bool
	Bytes   uint64
	// quantity is Bytes as written, canonicalized.
	quantity string
}

// ParsePinBudget reads "25%" or a quantity such as "20Gi" or "500M".
func ParsePinBudget(s string) (PinBudget, error) {
	if v, ok := strings.CutSuffix(s, "%"); ok {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > 100 {
			return PinBudget{}, fmt.Errorf("%q is not a share of the image filesystem: use a whole percentage from 0%% to 100%%, such as 25%%", s)
		}
		return PinBudget{Percent: n, IsShare: true}, nil
	}
	q, err := resource.ParseQuantity(s)
	if err != nil {
		return PinBudget{}, fmt.Errorf("%q is neither a percentage of the image filesystem (25%%) nor a quantity of bytes (20Gi)", s)
	}
	if q.Sign() < 0 {
		return PinBudget{}, fmt.Errorf("%q must not be negative", s)
	}
	n, ok := q.AsInt64()
	if !ok {
		return PinBudget{}, fmt.Errorf("%q is not a whole number of bytes", s)
	}
	return PinBudget{Bytes: uint64(n), quantity: q.String()}, nil
}

// Of returns the budget in bytes on a filesystem of the given capacity.
func (b PinBudget) Of(capacity uint64) uint64 {
	if !b.IsShare {
		return b.Bytes
	}
	return capacity / 100 * uint64(b.Percent)
}

// String is the canonical form, as the function renders it.
func (b PinBudget) String() string {
	if b.IsShare {
		return strconv.Itoa(b.Percent) + "%"
	}
	if b.quantity == "" {
		return strconv.FormatUint(b.Bytes, 10)
	}
	return b.quantity
}
