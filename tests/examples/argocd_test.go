package examples_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"
)

// configManagementPlugin is the part of Argo CD's plugin.yaml the example
// uses. Decoding is strict, so a misspelt field fails here instead of being
// ignored by Argo CD.
type configManagementPlugin struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		Version  string `json:"version,omitempty"`
		Generate struct {
			Command []string `json:"command"`
			Args    []string `json:"args,omitempty"`
		} `json:"generate"`
		Discover map[string]any `json:"discover,omitempty"`
	} `json:"spec"`
}

type argoApplication struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
	Spec struct {
		Project string `json:"project"`
		Source  struct {
			RepoURL        string `json:"repoURL"`
			TargetRevision string `json:"targetRevision"`
			Path           string `json:"path"`
			Plugin         struct {
				Name string `json:"name"`
			} `json:"plugin"`
		} `json:"source"`
		Destination struct {
			Server    string `json:"server"`
			Namespace string `json:"namespace"`
		} `json:"destination"`
		SyncPolicy map[string]any `json:"syncPolicy"`
	} `json:"spec"`
}

func readStrict(t *testing.T, tl tools, rel string, into any) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(tl.root, rel))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(data, into); err != nil {
		t.Fatalf("%s: %v", rel, err)
	}
	return data
}

func testArgoCD(t *testing.T, tl tools, api *apiServer) {
	var plugin configManagementPlugin
	pluginYAML := readStrict(t, tl, "examples/argocd/plugin.yaml", &plugin)
	if plugin.APIVersion != "argoproj.io/v1alpha1" || plugin.Kind != "ConfigManagementPlugin" {
		t.Fatalf("plugin.yaml is %s %s, want argoproj.io/v1alpha1 ConfigManagementPlugin", plugin.APIVersion, plugin.Kind)
	}
	if plugin.Spec.Discover != nil {
		t.Errorf("plugin.yaml has a discover rule; exec functions must stay opt-in per Application")
	}

	var rendered []byte
	// The repo-server runs generate.command + generate.args in the
	// Application's path; the sidecar image puts kustomize and the function
	// on PATH, as ./bin does here.
	t.Run("cmp-generate", func(t *testing.T) {
		argv := slices.Concat(plugin.Spec.Generate.Command, plugin.Spec.Generate.Args)
		if len(argv) == 0 {
			t.Fatal("plugin.yaml has no generate command")
		}
		dir := tl.copyTree(t, "examples/argocd/app", t.TempDir())
		env := append(tl.env(), "ARGOCD_APP_NAME=image-prefetcher", "ARGOCD_APP_NAMESPACE=image-prefetcher", "ARGOCD_APP_SOURCE_PATH=image-prefetcher")
		rendered = tl.run(t, dir, env, argv...)
		tl.golden(t, "examples/argocd/expected.yaml", rendered)
		api.dryRunApply(t, rendered)
	})

	t.Run("application", func(t *testing.T) {
		var app argoApplication
		readStrict(t, tl, "examples/argocd/application.yaml", &app)
		name := plugin.Metadata.Name
		if plugin.Spec.Version != "" {
			name += "-" + plugin.Spec.Version // how Argo CD names versioned plugins
		}
		if app.Spec.Source.Plugin.Name != name {
			t.Errorf("application.yaml uses plugin %q, plugin.yaml defines %q", app.Spec.Source.Plugin.Name, name)
		}
		if rendered == nil {
			t.Fatal("cmp-generate did not render")
		}
		for _, o := range decodeObjects(t, rendered) {
			if ns := o.GetNamespace(); ns != "" && ns != app.Spec.Destination.Namespace {
				t.Errorf("%s %s/%s is outside the Application's destination namespace %q", o.GetKind(), ns, o.GetName(), app.Spec.Destination.Namespace)
			}
		}
	})

	// The README's install steps, against a stand-in for the upstream
	// repo-server Deployment (same container, volumes and init container
	// names as Argo CD's install.yaml).
	t.Run("repo-server-patch", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cs, err := api.c.Clientset()
		if err != nil {
			t.Fatal(err)
		}
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "argocd"}}
		if _, err := cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := cs.AppsV1().Deployments("argocd").Create(ctx, upstreamRepoServer(), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		// kubectl -n argocd create configmap image-prefetcher-cmp --from-file=plugin.yaml
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "image-prefetcher-cmp", Namespace: "argocd"}, Data: map[string]string{"plugin.yaml": string(pluginYAML)}}
		if _, err := cs.CoreV1().ConfigMaps("argocd").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		// kubectl -n argocd patch deployment argocd-repo-server --patch-file repo-server-patch.yaml
		patch := yamlToJSON(t, tl, "examples/argocd/repo-server-patch.yaml")
		d, err := cs.AppsV1().Deployments("argocd").Patch(ctx, "argocd-repo-server", types.StrategicMergePatchType, patch, metav1.PatchOptions{FieldValidation: "Strict"})
		if err != nil {
			t.Fatalf("patch the repo-server: %v", err)
		}
		spec := d.Spec.Template.Spec
		i := slices.IndexFunc(spec.Containers, func(c corev1.Container) bool { return c.Name == "image-prefetcher-cmp" })
		if i < 0 || len(spec.Containers) != 2 {
			t.Fatalf("patched repo-server containers: %v", containerNames(spec.Containers))
		}
		side := spec.Containers[i]
		if !slices.Equal(side.Command, []string{"/var/run/argocd/argocd-cmp-server"}) {
			t.Errorf("sidecar command %v, want the plugin server Argo CD copies into var-files", side.Command)
		}
		if sc := side.SecurityContext; sc == nil || sc.RunAsUser == nil || *sc.RunAsUser != 999 {
			t.Errorf("the sidecar must run as user 999, as Argo CD requires")
		}
		mounts := map[string]corev1.VolumeMount{}
		for _, m := range side.VolumeMounts {
			mounts[m.MountPath] = m
		}
		if m := mounts["/home/argocd/cmp-server/config/plugin.yaml"]; m.Name != "image-prefetcher-cmp" || m.SubPath != "plugin.yaml" {
			t.Errorf("plugin.yaml is not mounted from the ConfigMap: %+v", m)
		}
		for _, p := range []string{"/var/run/argocd", "/home/argocd/cmp-server/plugins", "/tmp"} {
			if _, ok := mounts[p]; !ok {
				t.Errorf("sidecar does not mount %s", p)
			}
		}
	})

	// The alternative: Argo CD's own kustomize with kustomize.buildOptions.
	// The repo-server runs `kustomize build <path> <buildOptions>`; it must
	// render the same output as the plugin.
	t.Run("build-options", func(t *testing.T) {
		var cm corev1.ConfigMap
		readStrict(t, tl, "examples/argocd/build-options/argocd-cm-patch.yaml", &cm)
		opts := strings.Fields(cm.Data["kustomize.buildOptions"])
		for _, want := range []string{"--enable-alpha-plugins", "--enable-exec"} {
			if !slices.Contains(opts, want) {
				t.Errorf("kustomize.buildOptions %q lacks %s", opts, want)
			}
		}
		dir := tl.copyTree(t, "examples/argocd/app", t.TempDir())
		out := tl.run(t, dir, tl.env(), slices.Concat([]string{tl.kustomize, "build", "."}, opts)...)
		tl.golden(t, "examples/argocd/expected.yaml", out)
	})
}

func containerNames(cs []corev1.Container) []string {
	var n []string
	for _, c := range cs {
		n = append(n, c.Name)
	}
	return n
}

func yamlToJSON(t *testing.T, tl tools, rel string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(tl.root, rel))
	if err != nil {
		t.Fatal(err)
	}
	j, err := yaml.YAMLToJSON(data)
	if err != nil {
		t.Fatalf("%s: %v", rel, err)
	}
	return j
}

// upstreamRepoServer has the shape of argocd-repo-server in Argo CD's
// install.yaml where the plugin patch touches it.
func upstreamRepoServer() *appsv1.Deployment {
	labels := map[string]string{"app.kubernetes.io/name": "argocd-repo-server"}
	emptyDir := func(name string) corev1.Volume {
		return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}
	}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "argocd-repo-server", Namespace: "argocd", Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					ServiceAccountName: "argocd-repo-server",
					InitContainers: []corev1.Container{{
						Name:         "copyutil",
						Image:        "quay.io/argoproj/argocd:v3.1.0",
						Command:      []string{"/bin/cp", "-n", "/usr/local/bin/argocd", "/var/run/argocd/argocd-cmp-server"},
						VolumeMounts: []corev1.VolumeMount{{Name: "var-files", MountPath: "/var/run/argocd"}},
					}},
					Containers: []corev1.Container{{
						Name:    "argocd-repo-server",
						Image:   "quay.io/argoproj/argocd:v3.1.0",
						Command: []string{"argocd-repo-server"},
						VolumeMounts: []corev1.VolumeMount{
							{Name: "plugins", MountPath: "/home/argocd/cmp-server/plugins"},
							{Name: "tmp", MountPath: "/tmp"},
						},
					}},
					Volumes: []corev1.Volume{emptyDir("var-files"), emptyDir("plugins"), emptyDir("tmp")},
				},
			},
		},
	}
}
