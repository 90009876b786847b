package testenv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// ConnRateResult is the outcome of ConnRate.
type ConnRateResult struct {
	// Conns is how many connections completed a request and its response.
	Conns int64
	// Failed is how many connections failed (connect, send, receive).
	Failed int64
	// Duration is the measured time.
	Duration time.Duration
	// FirstErr is the first failure, for the report.
	FirstErr string
	// Saw is the source address the server saw on the first connection.
	Saw netip.Addr
}

// PerSecond returns completed connections per second.
func (r ConnRateResult) PerSecond() float64 {
	if r.Duration <= 0 {
		return 0
	}
	return float64(r.Conns) / r.Duration.Seconds()
}

// connRateMsg is the size of the request and of the response.
const connRateMsg = 64

// ConnRate measures TCP connection rate from the namespace srcNS to a server it
// opens in dstNS on dst: workers loops, each on its own thread in srcNS, open a
// connection, send a 64-byte request, read the 64-byte response and the
// server's close, and close, as many times as they can for d. The server
// closes first, so TIME_WAIT stays on its side and the client's ports come
// free at once.
func ConnRate(ctx context.Context, srcNS, dstNS string, dst netip.Addr, workers int, d time.Duration) (ConnRateResult, error) {
	if workers < 1 {
		return ConnRateResult{}, fmt.Errorf("measure connection rate: workers %d: want at least 1", workers)
	}
	var ln *net.TCPListener
	if err := Do(dstNS, func() error {
		l, err := net.Listen("tcp4", netip.AddrPortFrom(dst, 0).String())
		if err == nil {
			ln = l.(*net.TCPListener)
		}
		return err
	}); err != nil {
		return ConnRateResult{}, fmt.Errorf("listen in %s: %w", dstNS, err)
	}
	var saw atomic.Value
	var srvWG sync.WaitGroup
	srvWG.Add(1)
	go func() {
		defer srvWG.Done()
		for {
			c, err := ln.AcceptTCP()
			if err != nil {
				return
			}
			if saw.Load() == nil {
				saw.Store(c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap())
			}
			srvWG.Add(1)
			go func() {
				defer srvWG.Done()
				defer c.Close()
				c.SetDeadline(time.Now().Add(5 * time.Second))
				buf := make([]byte, connRateMsg)
				if _, err := io.ReadFull(c, buf); err != nil {
					return
				}
				c.Write(buf)
			}()
		}
	}()
	defer func() { ln.Close(); srvWG.Wait() }()

	var res ConnRateResult
	var conns, failed atomic.Int64
	var errOnce sync.Once
	deadline := time.Now().Add(d)
	start := time.Now()
	var wg sync.WaitGroup
	errc := make(chan error, workers)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Do keeps the loop on one thread inside srcNS: every socket it
			// opens is the pod's.
			errc <- Do(srcNS, func() error {
				req := make([]byte, connRateMsg)
				resp := make([]byte, connRateMsg+1)
				dialer := net.Dialer{Timeout: 2 * time.Second}
				for time.Now().Before(deadline) && ctx.Err() == nil {
					err := connRateOnce(ctx, &dialer, ln.Addr().String(), req, resp)
					if err != nil {
						failed.Add(1)
						errOnce.Do(func() { res.FirstErr = err.Error() })
						continue
					}
					conns.Add(1)
				}
				return nil
			})
		}()
	}
	wg.Wait()
	res.Duration = time.Since(start)
	close(errc)
	for err := range errc {
		if err != nil {
			return res, fmt.Errorf("measure connection rate: %w", err)
		}
	}
	res.Conns, res.Failed = conns.Load(), failed.Load()
	if v, ok := saw.Load().(netip.Addr); ok {
		res.Saw = v
	}
	if res.Conns == 0 {
		return res, fmt.Errorf("measure connection rate: no connection completed (%d failed: %s)", res.Failed, res.FirstErr)
	}
	return res, ctx.Err()
}

// connRateOnce runs one connection of ConnRate.
func connRateOnce(ctx context.Context, dialer *net.Dialer, to string, req, resp []byte) error {
	c, err := dialer.DialContext(ctx, "tcp4", to)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write(req); err != nil {
		return fmt.Errorf("send: %w", err)
	}
	n, err := io.ReadFull(c, resp[:connRateMsg])
	if err != nil {
		return fmt.Errorf("receive after %d bytes: %w", n, err)
	}
	// Wait for the server's close, so it holds the TIME_WAIT.
	if n, err := c.Read(resp); !errors.Is(err, io.EOF) {
		return fmt.Errorf("await close: read %d bytes, %v", n, err)
	}
	return nil
}
