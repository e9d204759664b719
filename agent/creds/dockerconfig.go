package creds

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
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
	if err != nil {
		// The error never quotes the content: it holds secrets.
		return fmt.Errorf("docker config %s: %w", path, err)
	}
	for key, c := range entries {
		c.Source = path
		k.Add(key, c)
	}
	return nil
}

// ParseDockerConfig reads either format: {"auths":{key:entry}} or the
// legacy {key:entry}.
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
	for key, msg := range raw {
		var e dockerConfigEntry
		if err := json.Unmarshal(msg, &e); err != nil {
			// Non-entry keys of a config.json ("credHelpers", ...) are skipped.
			continue
		}
		c := Credential{Username: e.Username, Password: e.Password, IdentityToken: e.IdentityToken, RegistryToken: e.RegistryToken}
		if e.Auth != "" {
			dec, err := base64.StdEncoding.DecodeString(e.Auth)
			if err != nil {
				return nil, fmt.Errorf("entry %q: auth is not base64", key)
			}
			user, pass, ok := strings.Cut(string(dec), ":")
			if !ok {
				return nil, fmt.Errorf("entry %q: auth is not user:password", key)
			}
			c.Username, c.Password = user, pass
		}
		if c.Username == "" && c.Password == "" && c.IdentityToken == "" && c.RegistryToken == "" {
			continue
		}
		out[key] = c
	}
	return out, nil
}
