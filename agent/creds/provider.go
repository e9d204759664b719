package creds

import (
	"context"
	"log/slog"

	"github.com/image-prefetcher/image-prefetcher/agent/cri"
	"github.com/image-prefetcher/image-prefetcher/fn/imagelist"
)

// Provider combines docker config credentials and exec plugins. It
// implements pull.Credentials.
type Provider struct {
	Keyring Keyring
	// Secrets are pull-secret files, read again when they change.
	Secrets *DockerConfigs
	Plugins []*Plugin
	Log     *slog.Logger
}

// Lookup returns every credential to try for image (a normalized
// reference), as CRI auth configs whose ServerAddress carries a scheme.
func (p *Provider) Lookup(ctx context.Context, image string) []cri.Auth {
	log := p.Log
	if log == nil {
		log = slog.Default()
	}
	creds := append(p.Keyring.Lookup(image), p.Secrets.Lookup(image)...)
	for _, pl := range p.Plugins {
		c, err := pl.Lookup(ctx, image)
		if err != nil {
			log.Warn("credential provider failed; trying other credentials", "image", image, "err", err)
			continue
		}
		creds = append(creds, c...)
	}
	if len(creds) == 0 {
		return nil
	}
	host, err := imagelist.Host(image)
	if err != nil {
		return nil
	}
	// containerd compares the address's host with the host it is about to
	// contact, and for Docker Hub that is registry-1.docker.io.
	if host == "docker.io" {
		host = "registry-1.docker.io"
	}
	out := make([]cri.Auth, 0, len(creds))
	for _, c := range creds {
		log.Debug("credential matches", "image", image, "credential", c)
		out = append(out, cri.Auth{
			Username:      c.Username,
			Password:      c.Password,
			IdentityToken: c.IdentityToken,
			RegistryToken: c.RegistryToken,
			ServerAddress: "https://" + host,
		})
	}
	return out
}
