package testenv

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"time"
)

// BulkResult is the outcome of one bulk TCP transfer.
type BulkResult struct {
	// Bytes is what the receiver counted.
	Bytes int64
	// Duration runs from connect to the receiver's count coming back.
	Duration time.Duration
	// MaxGap is the longest time the receiver waited between two reads: a
	// stalled flow shows up here even when it recovers.
	MaxGap time.Duration
}

// Gbps is the goodput in Gbit/s.
func (r BulkResult) Gbps() float64 {
	return float64(r.Bytes) * 8 / r.Duration.Seconds() / 1e9
}

// BulkTCP sends n bytes over one TCP connection from the namespace srcNS to a
// receiver it opens in dstNS on dst (IPv4 or IPv6), and returns what the
// receiver counted. The transfer ends with ctx.
func BulkTCP(ctx context.Context, srcNS, dstNS string, dst netip.Addr, n int64) (BulkResult, error) {
	var ln net.Listener
	if err := Do(dstNS, func() error {
		var err error
		ln, err = net.Listen(network("tcp", dst), netip.AddrPortFrom(dst, 0).String())
		return err
	}); err != nil {
		return BulkResult{}, fmt.Errorf("listen in %s: %w", dstNS, err)
	}
	defer ln.Close()
	type recvResult struct {
		bytes  int64
		maxGap time.Duration
		err    error
	}
	recvc := make(chan recvResult, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			recvc <- recvResult{err: fmt.Errorf("accept: %w", err)}
			return
		}
		defer c.Close()
		stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Now()) })
		defer stop()
		var r recvResult
		buf := make([]byte, 256<<10)
		last := time.Now()
		for {
			m, err := c.Read(buf)
			now := time.Now()
			r.maxGap = max(r.maxGap, now.Sub(last))
			last = now
			r.bytes += int64(m)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				r.err = fmt.Errorf("receive after %d bytes: %w", r.bytes, err)
				recvc <- r
				return
			}
		}
		var count [8]byte
		binary.BigEndian.PutUint64(count[:], uint64(r.bytes))
		if _, err := c.Write(count[:]); err != nil {
			r.err = fmt.Errorf("report count: %w", err)
		}
		recvc <- r
	}()

	start := time.Now()
	var c net.Conn
	if err := Do(srcNS, func() error {
		var err error
		c, err = (&net.Dialer{Timeout: 3 * time.Second}).DialContext(ctx, network("tcp", dst), ln.Addr().String())
		return err
	}); err != nil {
		return BulkResult{}, fmt.Errorf("connect from %s: %w", srcNS, err)
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Now()) })
	defer stop()
	buf := make([]byte, 1<<20)
	var sent int64
	for sent < n {
		chunk := buf[:min(int64(len(buf)), n-sent)]
		m, err := c.Write(chunk)
		sent += int64(m)
		if err != nil {
			return BulkResult{}, fmt.Errorf("send after %d bytes: %w", sent, err)
		}
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		return BulkResult{}, fmt.Errorf("close write: %w", err)
	}
	var count [8]byte
	if _, err := io.ReadFull(c, count[:]); err != nil {
		r := <-recvc
		return BulkResult{Bytes: r.bytes, MaxGap: r.maxGap}, fmt.Errorf("read count back: %w (receiver: %v)", err, r.err)
	}
	res := BulkResult{Duration: time.Since(start)}
	r := <-recvc
	res.Bytes, res.MaxGap = r.bytes, r.maxGap
	if r.err != nil {
		return res, r.err
	}
	if got := int64(binary.BigEndian.Uint64(count[:])); got != res.Bytes {
		return res, fmt.Errorf("receiver reported %d bytes, counted %d", got, res.Bytes)
	}
	return res, nil
}
