package creds

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Credential is one registry login. Its String and LogValue never reveal
// secrets, so logging one by mistake leaks nothing.
type Credential struct {
	Username      string
	Password      string
	IdentityToken string
	RegistryToken string
	// Source says where the credential came from, for logs.
	Source string
}

// String names the credential without its secrets.
func (c Credential) String() string {
	return fmt.Sprintf("credential{user:%q source:%q}", c.Username, c.Source)
}

// LogValue keeps secrets out of structured logs.
func (c Credential) LogValue() slog.Value { return slog.StringValue(c.String()) }

// GoString is used by %#v.
func (c Credential) GoString() string { return c.String() }

type dockerConfigEntry struct {
	Auth          string `json:"auth"`
	Username      string `json:"username"`
	Password      string `json:"password"`
	IdentityToken string `json:"identitytoken"`
	RegistryToken string `json:"registrytoken"`
}

// File names inside a pull-secret volume.
const (
	DockerConfigJSONKey = ".dockerconfigjson"
	DockerConfigKey     = ".dockercfg"
)

// LoadDockerConfig adds the credentials at path to k. path is a pull-secret
// directory holding .dockerconfigjson and/or .dockercfg, or a single file
// in either format (a docker config.json works too).
func LoadDockerConfig(k *Keyring, path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("docker config %s: %w", path, err)
	}
	if !st.IsDir() {
		return loadFile(k, path)
	}
	found := false
	for _, name := range []string{DockerConfigJSONKey, DockerConfigKey} {
		p := filepath.Join(path, name)
		if _, err := os.Stat(p); errors.Is(err, os.ErrNotExist) {
			continue
		}
		found = true
		if err := loadFile(k, p); err != nil {
			return err
		}
	}
	if !found {
		return fmt.Errorf("docker config directory %s holds neither %s nor %s", path, DockerConfigJSONKey, DockerConfigKey)
	}
	return nil
}

func loadFile(k *Keyring, path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read docker config: %w", err)
	}
	entries, err := ParseDockerConfig(data)
	for key, c := range entries {
		c.Source = path
		k.Add(key, c)
	}
	if err != nil {
		// The error never quotes the content: it holds secrets.
		return fmt.Errorf("docker config %s: %w", path, err)
	}
	return nil
}

// ParseDockerConfig reads either format: {"auths":{key:entry}} or the
// legacy {key:entry}. An entry whose auth cannot be decoded is left out and
// named in the error, and the other entries are still returned: one bad
// entry must not cost every registry of the Secret its credentials. The
// error never quotes a value.
func ParseDockerConfig(data []byte) (map[string]Credential, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, errors.New("not valid JSON")
	}
	if auths, ok := raw["auths"]; ok {
		if err := json.Unmarshal(auths, &raw); err != nil {
			return nil, errors.New(`"auths" is not an object`)
		}
	}
	out := make(map[string]Credential, len(raw))
	var bad []string
	for key, msg := range raw {
		var e dockerConfigEntry
		if err := json.Unmarshal(msg, &e); err != nil {
			// Non-entry keys of a config.json ("credHelpers", ...) are skipped.
			continue
		}
		c := Credential{Username: e.Username, Password: e.Password, IdentityToken: e.IdentityToken, RegistryToken: e.RegistryToken}
		if e.Auth != "" {
			user, pass, err := decodeAuth(e.Auth)
			if err != nil {
				bad = append(bad, fmt.Sprintf("entry %q: %v", key, err))
				continue
			}
			c.Username, c.Password = user, pass
		}
		if c.Username == "" && c.Password == "" && c.IdentityToken == "" && c.RegistryToken == "" {
			continue
		}
		out[key] = c
	}
	if len(bad) > 0 {
		sort.Strings(bad)
		return out, fmt.Errorf("left out: %s", strings.Join(bad, "; "))
	}
	return out, nil
}

// decodeAuth decodes an entry's auth field as the kubelet does
// (credentialprovider's decodeDockerConfigFieldAuth): padded base64 when it
// ends in "=", unpadded (raw) base64 otherwise, then user:password.
func decodeAuth(field string) (user, pass string, err error) {
	var dec []byte
	if strings.HasSuffix(strings.TrimSpace(field), "=") {
		dec, err = base64.StdEncoding.DecodeString(field)
	} else {
		dec, err = base64.RawStdEncoding.DecodeString(field)
	}
	if err != nil {
		return "", "", errors.New("auth is not base64")
	}
	user, pass, ok := strings.Cut(string(dec), ":")
	if !ok {
		return "", "", errors.New("auth is not user:password")
	}
	return user, pass, nil
}
