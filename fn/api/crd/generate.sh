#!/bin/sh
# Writes the ImagePrefetcher CRD into fn/api/crd from fn/api/v1alpha1, with
# controller-gen (CONTROLLER_GEN, default: controller-gen on PATH; make crd
# installs v0.23.0 into ./bin). The CRD is for tools that read schemas
# (editors, kubeconform, Argo CD's diffing); no cluster needs it, the
# ImagePrefetcher never reaches one.
#
# controller-gen knows a kind by its embedded metav1.TypeMeta and
# metav1.ObjectMeta. The API names its fields instead (the function's
# strict decoder checks every field by its JSON name), so a scratch copy of
# the package embeds them in their place; the schema is the same.
set -eu
gen=${CONTROLLER_GEN:-controller-gen}
root=$(cd "$(dirname "$0")/../../.." && pwd)
out=${1:-$root/fn/api/crd}
tmp=$(mktemp -d "$root/fn/api/crdgen-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
for f in "$root"/fn/api/v1alpha1/*.go; do
	case $f in *_test.go) ;; *) cp "$f" "$tmp/" ;; esac
done
sed -i -e 's/^\tAPIVersion string \{1,\}`json:"apiVersion"`$/\tmetav1.TypeMeta `json:",inline"`/' \
	-e '/^\tKind \{1,\}string \{1,\}`json:"kind"`$/d' \
	-e 's/^\tMetadata \{1,\}metav1.ObjectMeta `json:"metadata"`$/\tmetav1.ObjectMeta `json:"metadata,omitempty"`/' "$tmp/types.go"
grep -q 'metav1.TypeMeta `json:",inline"`' "$tmp/types.go" && grep -q 'metav1.ObjectMeta `json:"metadata,omitempty"`' "$tmp/types.go" ||
	{ echo "generate.sh: ImagePrefetcher's apiVersion, kind or metadata field not found in fn/api/v1alpha1/types.go" >&2; exit 1; }
cd "$root" && "$gen" crd paths="./fn/api/$(basename "$tmp")" output:crd:dir="$out"
