package creds

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
)

// DockerConfigs are the pull secrets given with --docker-config, read again
// whenever one of their files changes. The kubelet updates a mounted Secret
// in place (it writes a new directory and swaps the ..data symlink), for
// example when a refreshed registry token is written to it; a long-running
// watch must send the new password, not the one it read at start.
//
// A change is noticed by stat alone (inode, size, modification time of each
// file, after symlinks), so checking before every lookup is cheap.
type DockerConfigs struct {
	Paths []string
	Log   *slog.Logger

	mu      sync.Mutex
	loaded  bool
	stamp   string
	keyring Keyring
}

// Lookup returns the credentials of the current files for image.
func (d *DockerConfigs) Lookup(image string) []Credential {
	if d == nil || len(d.Paths) == 0 {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.refresh()
	return d.keyring.Lookup(image)
}

// Refresh reads the files again if they changed since they were last read.
func (d *DockerConfigs) Refresh() {
	if d == nil || len(d.Paths) == 0 {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.refresh()
}

func (d *DockerConfigs) refresh() {
	if s := d.fingerprint(); !d.loaded || s != d.stamp {
		d.reload(s)
	}
}

// reload reads every path again. An unusable file is logged and skipped:
// the images that needed it fail as Unauthorized, and the label says so.
func (d *DockerConfigs) reload(stamp string) {
	log := d.Log
	if log == nil {
		log = slog.Default()
	}
	var k Keyring
	for _, p := range d.Paths {
		if err := LoadDockerConfig(&k, p); err != nil {
			log.Error("pull secret unusable, wholly or in part; continuing without what could not be read", "err", err)
		}
	}
	if d.loaded {
		log.Info("pull secrets changed; read them again", "paths", d.Paths)
	}
	d.keyring, d.stamp, d.loaded = k, stamp, true
}

// fingerprint describes the files behind every path as stat sees them.
func (d *DockerConfigs) fingerprint() string {
	var b strings.Builder
	for _, p := range d.Paths {
		st, err := os.Stat(p)
		if err != nil || !st.IsDir() {
			b.WriteString(statStamp(p, st, err))
			continue
		}
		for _, name := range []string{DockerConfigJSONKey, DockerConfigKey} {
			f := filepath.Join(p, name)
			st, err := os.Stat(f)
			b.WriteString(statStamp(f, st, err))
		}
	}
	return b.String()
}

func statStamp(path string, st os.FileInfo, err error) string {
	if err != nil {
		return path + " -\n"
	}
	var ino uint64
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		ino = sys.Ino
	}
	return fmt.Sprintf("%s %d %d %d\n", path, ino, st.Size(), st.ModTime().UnixNano())
}
