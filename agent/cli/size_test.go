package cli

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	k8stesting "k8s.io/client-go/testing"
)

// A very long invalid reference passed as an argument used to make the
// annotation patch Invalid, so fetch crash-looped and the node had no
// label. The fake API server here checks annotations as the real one does.
func TestFetchHugeInvalidReferenceStillLabels(t *testing.T) {
	e := newEnv(t)
	tracker := e.kube.Tracker()
	e.kube.PrependReactor("patch", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		p := a.(k8stesting.PatchAction)
		obj, err := tracker.Get(schema.GroupVersionResource{Version: "v1", Resource: "nodes"}, "", p.GetName())
		if err != nil {
			return true, nil, err
		}
		before := obj.(*corev1.Node).DeepCopy()
		// Let the default reactor apply the patch, then check the outcome
		// and put the old node back if it is invalid.
		handled, out, err := k8stesting.ObjectReaction(tracker)(a)
		if err != nil || out == nil {
			return handled, out, err
		}
		if errs := apivalidation.ValidateAnnotations(out.(*corev1.Node).Annotations, field.NewPath("metadata", "annotations")); len(errs) > 0 {
			_ = tracker.Update(schema.GroupVersionResource{Version: "v1", Resource: "nodes"}, before, "")
			return true, nil, apierrors.NewInvalid(schema.GroupKind{Kind: "Node"}, p.GetName(), errs)
		}
		return handled, out, err
	})
	huge := "Bad::" + strings.Repeat("x", 300<<10)
	if code := e.run(e.agentArgs("fetch", "x:1", huge)...); code != 0 {
		t.Fatalf("exit %d:\n%.2000s", code, e.logs)
	}
	v, s, ok := e.state()
	if !ok || v != "failed" || s.Present != 1 || s.FailureCount() != 1 || s.Failed[0].Reason != "InvalidReference" {
		t.Errorf("label %q summary %+v", v, s)
	}
	e.assertOthersUntouched()
}
