package webhook

import (
	"crypto/x509"
	"fmt"
	"log/slog"
	"os"
	"sync"
)

// clientCAs is the bundle that the API server's client certificate must
// chain to, re-read when its file changes (a stat per handshake, as for the
// serving certificate). A bundle that does not parse is logged once and the
// last good one stays.
type clientCAs struct {
	file string
	log  *slog.Logger

	mu     sync.Mutex // guards the fields below
	pool   *x509.CertPool
	stamp  os.FileInfo // of file when pool was loaded
	failed os.FileInfo // of the version that last failed
}

func loadClientCAs(file string, log *slog.Logger) (*clientCAs, error) {
	c := &clientCAs{file: file, log: log}
	fi, err := os.Stat(file)
	if err != nil {
		return nil, fmt.Errorf("tls-client-ca-file: %w", err)
	}
	if err := c.load(fi); err != nil {
		return nil, fmt.Errorf("tls-client-ca-file: %w", err)
	}
	return c, nil
}

// get returns the newest good pool.
func (c *clientCAs) get() *x509.CertPool {
	c.mu.Lock()
	defer c.mu.Unlock()
	fi, err := os.Stat(c.file)
	if err != nil || sameFile(fi, c.stamp) || sameFile(fi, c.failed) {
		return c.pool
	}
	if err := c.load(fi); err != nil {
		c.failed = fi
		c.log.Error("reload the client CA bundle; the previous one stays", "err", err)
	} else {
		c.log.Info("client CA bundle reloaded", "file", c.file)
	}
	return c.pool
}

// load reads the bundle; c.mu is held or c is not shared yet.
func (c *clientCAs) load(fi os.FileInfo) error {
	data, err := os.ReadFile(c.file)
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return fmt.Errorf("%s: no PEM certificate", c.file)
	}
	c.pool, c.stamp, c.failed = pool, fi, nil
	return nil
}

func sameFile(a, b os.FileInfo) bool {
	return a != nil && b != nil && os.SameFile(a, b) && a.Size() == b.Size() && a.ModTime().Equal(b.ModTime())
}
