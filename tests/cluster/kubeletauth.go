package cluster

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// Options.KubeletAuth: kubelets that ask the apiserver who is calling and
// whether it may (webhook authentication and authorization, as kubeadm
// sets them up), serving a certificate the cluster CA signed for the
// node's IP. The apiserver then calls them (logs, exec) with a client
// certificate of system:masters.

// kubeletAuth writes the node's serving certificate and returns the
// KubeletConfiguration fields, or nothing without Options.KubeletAuth.
func (n *Node) kubeletAuth() (map[string]any, error) {
	if !n.c.opts.KubeletAuth {
		return nil, nil
	}
	cert, key := n.KubeletServingCert()
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: "system:node:" + n.Name, Organization: []string{"system:nodes"}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.ParseIP(n.IP)},
		DNSNames:    []string{n.Name},
	}
	if err := n.c.pki.sign(tmpl, cert, key); err != nil {
		return nil, fmt.Errorf("kubelet serving certificate: %w", err)
	}
	return map[string]any{
		"tlsCertFile":       cert,
		"tlsPrivateKeyFile": key,
		"authentication": map[string]any{
			"anonymous": map[string]any{"enabled": false},
			"webhook":   map[string]any{"enabled": true},
			"x509":      map[string]any{"clientCAFile": n.c.pki.CACert},
		},
		"authorization": map[string]any{"mode": "Webhook"},
	}, nil
}

// KubeletServingCert is the certificate and key node n's kubelet serves,
// with Options.KubeletAuth: what a stand-in for the kubelet presents.
func (n *Node) KubeletServingCert() (cert, key string) {
	return filepath.Join(n.Dir, "kubelet-serving.crt"), filepath.Join(n.Dir, "kubelet-serving.key")
}

func (c *Cluster) kubeletClientCert() (cert, key string) {
	return c.path("pki", "apiserver-kubelet-client.crt"), c.path("pki", "apiserver-kubelet-client.key")
}

// writeKubeletClientCert writes the apiserver's client certificate for
// kubelets, with Options.KubeletAuth.
func (c *Cluster) writeKubeletClientCert() error {
	if !c.opts.KubeletAuth {
		return nil
	}
	cert, key := c.kubeletClientCert()
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver-kubelet-client", Organization: []string{"system:masters"}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if err := c.pki.sign(tmpl, cert, key); err != nil {
		return fmt.Errorf("apiserver kubelet client certificate: %w", err)
	}
	return nil
}

func (c *Cluster) apiServerKubeletArgs() []string {
	if !c.opts.KubeletAuth {
		return nil
	}
	cert, key := c.kubeletClientCert()
	return []string{"--kubelet-client-certificate=" + cert, "--kubelet-client-key=" + key}
}

// sign issues a certificate from tmpl (subject, usages, names) with a new
// key, signed by the CA, and writes both.
func (p *pki) sign(tmpl *x509.Certificate, certPath, keyPath string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		return err
	}
	now := time.Now().Add(-time.Hour)
	tmpl.SerialNumber, tmpl.NotBefore, tmpl.NotAfter = serial, now, now.Add(7*24*time.Hour)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.caKey)
	if err != nil {
		return err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	if err := os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return err
	}
	return os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600)
}
