package release

import (
	"os"

	"github.com/google/go-containerregistry/pkg/authn"
)

// Keychain gives host the credentials of REGISTRY_USERNAME and
// REGISTRY_PASSWORD when both are set (a CI job's token), and otherwise
// what the docker config holds for a registry (`docker login`, credential
// helpers).
func Keychain(host string) authn.Keychain {
	return authn.NewMultiKeychain(envKeychain{host: host}, authn.DefaultKeychain)
}

type envKeychain struct{ host string }

func (k envKeychain) Resolve(r authn.Resource) (authn.Authenticator, error) {
	user, pass := os.Getenv("REGISTRY_USERNAME"), os.Getenv("REGISTRY_PASSWORD")
	if r.RegistryStr() != k.host || user == "" || pass == "" {
		return authn.Anonymous, nil
	}
	return &authn.Basic{Username: user, Password: pass}, nil
}
