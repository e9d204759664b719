package imagelist

// KubeletRef is the reference the kubelet sends to the container runtime
// for ref written in a pod spec: ref unchanged, with ":latest" appended when
// it has neither tag nor digest. The kubelet does not qualify short names
// ("busybox" stays "busybox:latest", not "docker.io/library/busybox:latest"):
// CRI-O resolves them through its registries.conf aliases and search
// registries, containerd to Docker Hub. Asking the runtime for the same
// string is what makes the agent prefetch the image the pods will run.
func KubeletRef(ref string) (string, error) {
	r, err := parseNormalized(ref)
	if err != nil {
		return "", err
	}
	if r.tag == "" && r.digest == "" {
		return ref + ":" + defaultTag, nil
	}
	return ref, nil
}
