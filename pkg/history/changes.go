package history

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
)

// Reconnection backoff of a Changes listener: doubling from min to max,
// with jitter so that many controllers do not reconnect in step.
const (
	listenBackoffMin = 100 * time.Millisecond
	listenBackoffMax = 5 * time.Second
	listenTimeout    = 10 * time.Second // to connect and LISTEN once
)

// Changes implements LimitStore. Each subscription has its own connection,
// outside the pool (a LISTENing connection can not be shared), and a
// goroutine owned by the store: it ends when ctx ends or the store closes,
// and closes the channel.
func (p *Postgres) Changes(ctx context.Context) (<-chan struct{}, error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, errors.New("history: changes: the store is closed")
	}
	p.wg.Add(1) // under mu: Close can not be past wg.Wait yet
	p.mu.Unlock()

	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(p.closing, cancel)
	// Listening before returning is what guarantees that a change
	// committed after Changes returns is signalled.
	conn, err := p.listenOnce(ctx)
	if err != nil {
		stop()
		cancel()
		p.wg.Done()
		return nil, fmt.Errorf("history: changes: %w", err)
	}
	ch := make(chan struct{}, 1)
	go func() {
		defer p.wg.Done()
		defer close(ch)
		defer cancel()
		defer stop()
		p.watch(ctx, conn, ch)
	}()
	return ch, nil
}

// listenOnce opens a connection and LISTENs on it.
func (p *Postgres) listenOnce(ctx context.Context) (*pgx.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, listenTimeout)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, p.listen)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{notifyChannel}.Sanitize()); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("listen: %w", err)
	}
	return conn, nil
}

// watch turns notifications into signals until ctx ends, reconnecting
// after a lost connection.
func (p *Postgres) watch(ctx context.Context, conn *pgx.Conn, ch chan<- struct{}) {
	signal := func() {
		select {
		case ch <- struct{}{}:
		default: // a signal is pending already: readers re-read everything anyway
		}
	}
	for {
		_, err := conn.WaitForNotification(ctx)
		if err == nil {
			signal()
			continue
		}
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		conn.Close(closeCtx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		p.opts.log.Warn("history: lost the limit change listener; reconnecting", "err", err)
		if conn = p.reconnect(ctx); conn == nil {
			return
		}
		p.opts.log.Info("history: limit change listener reconnected")
		signal() // changes committed while we were away were not heard
	}
}

// reconnect listens again, backing off between attempts, until it
// succeeds (the connection) or ctx ends (nil).
func (p *Postgres) reconnect(ctx context.Context) *pgx.Conn {
	delay := listenBackoffMin
	timer := time.NewTimer(jitter(delay))
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C:
		}
		conn, err := p.listenOnce(ctx)
		if err == nil {
			return conn
		}
		if ctx.Err() != nil {
			return nil
		}
		p.opts.log.Debug("history: limit change listener: reconnect failed", "err", err, "retry_in", delay)
		delay = min(2*delay, listenBackoffMax)
		timer.Reset(jitter(delay))
	}
}

// jitter returns a duration in [d/2, d).
func jitter(d time.Duration) time.Duration {
	return d/2 + rand.N(d/2)
}
