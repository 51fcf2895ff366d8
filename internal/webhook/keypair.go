package webhook

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"
)

// KeyPair serves a TLS certificate from a certificate file and a key file
// and reloads them when they change: cert-manager renews the Secret, the
// kubelet swaps the mounted files (an atomic symlink swap), and the next
// handshake presents the new certificate, with no restart.
//
// Every handshake stats both files, which is cheap at the rate an API server
// calls a webhook. A pair that can not be loaded (say, the certificate is
// new and the key still old, mid-rotation) is reported and the last good
// one is served until the files settle.
type KeyPair struct {
	certFile, keyFile string
	log               *slog.Logger
	// OnLoad, when set before the first handshake, is told of every attempt
	// to reload: the new certificate, or the error.
	OnLoad func(cert *x509.Certificate, err error)

	mu     sync.Mutex // guards the fields below
	cert   *tls.Certificate
	leaf   *x509.Certificate
	stamps [2]os.FileInfo // of certFile and keyFile when cert was loaded
	failed [2]os.FileInfo // of the files that last failed to load, so a bad pair is tried once
}

// LoadKeyPair reads the pair once; failing here is a start-up error.
func LoadKeyPair(certFile, keyFile string, log *slog.Logger) (*KeyPair, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	k := &KeyPair{certFile: certFile, keyFile: keyFile, log: log}
	stamps, err := k.stat()
	if err != nil {
		return nil, err
	}
	if err := k.load(stamps); err != nil {
		return nil, err
	}
	return k, nil
}

// Leaf is the certificate being served.
func (k *KeyPair) Leaf() *x509.Certificate {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.leaf
}

// GetCertificate is the tls.Config hook.
func (k *KeyPair) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	stamps, err := k.stat()
	switch {
	case err != nil:
		// Files missing for a moment: serve what we have.
	case same(stamps, k.stamps), same(stamps, k.failed):
	default:
		if err := k.load(stamps); err != nil {
			k.failed = stamps
			k.log.Error("reload the serving certificate; the previous one stays", "err", err)
			if k.OnLoad != nil {
				k.OnLoad(nil, err)
			}
		} else {
			k.log.Info("serving certificate reloaded", "not_after", k.leaf.NotAfter.UTC().Format(time.RFC3339), "serial", k.leaf.SerialNumber.String())
			if k.OnLoad != nil {
				k.OnLoad(k.leaf, nil)
			}
		}
	}
	return k.cert, nil
}

func (k *KeyPair) stat() ([2]os.FileInfo, error) {
	var s [2]os.FileInfo
	for i, f := range []string{k.certFile, k.keyFile} {
		fi, err := os.Stat(f)
		if err != nil {
			return s, fmt.Errorf("stat %s: %w", f, err)
		}
		s[i] = fi
	}
	return s, nil
}

// load reads both files; k.mu is held or k is not shared yet.
func (k *KeyPair) load(stamps [2]os.FileInfo) error {
	cert, err := tls.LoadX509KeyPair(k.certFile, k.keyFile)
	if err != nil {
		return fmt.Errorf("load the key pair %s, %s: %w", k.certFile, k.keyFile, err)
	}
	leaf := cert.Leaf
	if leaf == nil {
		if leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return fmt.Errorf("parse %s: %w", k.certFile, err)
		}
	}
	k.cert, k.leaf, k.stamps, k.failed = &cert, leaf, stamps, [2]os.FileInfo{}
	return nil
}

// same reports whether both files are unchanged: the same file (inode), the
// same size and modification time.
func same(a, b [2]os.FileInfo) bool {
	for i := range a {
		if a[i] == nil || b[i] == nil || !os.SameFile(a[i], b[i]) ||
			a[i].Size() != b[i].Size() || !a[i].ModTime().Equal(b[i].ModTime()) {
			return false
		}
	}
	return true
}
