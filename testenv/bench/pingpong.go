package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"

	"github.com/isthmus-dev/isthmus/testenv"
)

// The request/response test over IPv6. Debian's sockperf (3.7) takes IPv4
// addresses only, so pingPong does what `sockperf ping-pong --tcp` does, with
// the same defaults: one TCP connection (TCP_NODELAY on both ends), a 14-byte
// request, the server echoing it, the next request once the response is in,
// blocking sockets (no event loop between the packet and the reader), a
// warm-up left out. Its figures are comparable with each other, not with
// sockperf's.
const (
	// pingPongMsg is the size of a request and of its response: sockperf's
	// default message size.
	pingPongMsg = 14
	// pingPongWarmup is left out at the start, as sockperf's warm-up.
	pingPongWarmup = 400 * time.Millisecond
	// pingPongTimeout bounds the connect and every read and write: a path
	// lost in the middle of a run ends the run.
	pingPongTimeout = 5 * time.Second
)

// runner runs fn on a thread in some network namespace: the sockets fn opens
// belong to it for good.
type runner func(fn func() error) error

// nsRunner runs fn in the named network namespace (testenv.Do).
func nsRunner(ns string) runner {
	return func(fn func() error) error { return testenv.Do(ns, fn) }
}

// pingPongResult is the outcome of pingPong.
type pingPongResult struct {
	// Transactions completed in Elapsed, after the warm-up.
	Transactions int
	Elapsed      time.Duration
	// Saw is the client's address as the server's accept returned it.
	Saw netip.Addr
}

// TPS is transactions per second.
func (r pingPongResult) TPS() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Transactions) / r.Elapsed.Seconds()
}

// RTTMicros is the mean round trip of a transaction in µs.
func (r pingPongResult) RTTMicros() float64 {
	if r.Transactions == 0 {
		return 0
	}
	return float64(r.Elapsed) / float64(time.Microsecond) / float64(r.Transactions)
}

// pingPong listens on dst (port 0: any free port) with sockets of inDst's
// namespace, connects from inSrc's and runs request after response for d, of
// which the first pingPongWarmup is left out.
func pingPong(ctx context.Context, inSrc, inDst runner, dst netip.AddrPort, d time.Duration) (res pingPongResult, err error) {
	if d <= pingPongWarmup {
		return res, fmt.Errorf("ping-pong: duration %s: want more than the %s warm-up", d, pingPongWarmup)
	}
	family := unix.AF_INET
	if dst.Addr().Is6() {
		family = unix.AF_INET6
	}
	lfd := -1
	if err := inDst(func() error {
		fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("server socket: %w", err)
		}
		unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
		if err := unix.Bind(fd, sockaddr(dst)); err != nil {
			unix.Close(fd)
			return fmt.Errorf("bind %s: %w", dst, err)
		}
		if err := unix.Listen(fd, 1); err != nil {
			unix.Close(fd)
			return fmt.Errorf("listen on %s: %w", dst, err)
		}
		lfd = fd
		return nil
	}); err != nil {
		return res, err
	}
	defer unix.Close(lfd)
	if dst.Port() == 0 {
		sa, err := unix.Getsockname(lfd)
		if err != nil {
			return res, fmt.Errorf("server address: %w", err)
		}
		dst = netip.AddrPortFrom(dst.Addr(), uint16(sockPort(sa)))
	}

	type accepted struct {
		fd  int
		saw netip.Addr
		err error
	}
	acc := make(chan accepted, 1)
	go func() {
		for {
			fd, sa, err := unix.Accept4(lfd, unix.SOCK_CLOEXEC)
			if errors.Is(err, unix.EINTR) {
				continue
			}
			acc <- accepted{fd: fd, saw: addrOf(sa), err: err}
			return
		}
	}()
	cfd := -1
	if err := inSrc(func() error {
		fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("client socket: %w", err)
		}
		if err := tuneSocket(fd); err != nil {
			unix.Close(fd)
			return err
		}
		for {
			err = unix.Connect(fd, sockaddr(dst))
			if !errors.Is(err, unix.EINTR) {
				break
			}
		}
		if err != nil {
			unix.Close(fd)
			return fmt.Errorf("connect to %s: %w", dst, err)
		}
		cfd = fd
		return nil
	}); err != nil {
		// Wake the accept, which no connection will end.
		unix.Shutdown(lfd, unix.SHUT_RDWR)
		if a := <-acc; a.err == nil {
			unix.Close(a.fd)
		}
		return res, err
	}
	a := <-acc
	if a.err != nil {
		unix.Close(cfd)
		return res, fmt.Errorf("accept on %s: %w", dst, a.err)
	}
	res.Saw = a.saw
	served := make(chan error, 1)
	go func() {
		defer unix.Close(a.fd)
		if err := tuneSocket(a.fd); err != nil {
			served <- err
			return
		}
		buf := make([]byte, pingPongMsg)
		for {
			if err := readFull(a.fd, buf); err != nil {
				if err == io.EOF {
					err = nil // the client is done
				}
				served <- err
				return
			}
			if err := writeFull(a.fd, buf); err != nil {
				served <- err
				return
			}
		}
	}()
	res.Transactions, res.Elapsed, err = pingPongClient(ctx, cfd, d)
	unix.Close(cfd)
	if serr := <-served; serr != nil && err == nil {
		err = fmt.Errorf("server: %w", serr)
	}
	return res, err
}

// pingPongClient sends requests on fd one after another's response for d and
// counts those completed after the warm-up, and the time they took.
func pingPongClient(ctx context.Context, fd int, d time.Duration) (n int, elapsed time.Duration, err error) {
	buf := make([]byte, pingPongMsg)
	start := time.Now()
	warm, end := start.Add(pingPongWarmup), start.Add(d)
	var first, last time.Time
	for {
		if err := writeFull(fd, buf); err != nil {
			return 0, 0, fmt.Errorf("send request: %w", err)
		}
		if err := readFull(fd, buf); err != nil {
			return 0, 0, fmt.Errorf("read response: %w", err)
		}
		now := time.Now()
		switch {
		case now.Before(warm):
		case first.IsZero():
			first = now // the window opens with the first response after the warm-up
		default:
			n, last = n+1, now
		}
		if !now.Before(end) {
			break
		}
		if err := ctx.Err(); err != nil {
			return 0, 0, err
		}
	}
	if n == 0 {
		return 0, 0, errors.New("no transaction completed after the warm-up")
	}
	return n, last.Sub(first), nil
}

// tuneSocket sets what both ends of the ping-pong need: no Nagle delay on the
// small messages, and timeouts on every blocking call.
func tuneSocket(fd int) error {
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1); err != nil {
		return fmt.Errorf("TCP_NODELAY: %w", err)
	}
	tv := unix.NsecToTimeval(pingPongTimeout.Nanoseconds())
	for _, opt := range []int{unix.SO_RCVTIMEO, unix.SO_SNDTIMEO} {
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, opt, &tv); err != nil {
			return fmt.Errorf("socket timeout: %w", err)
		}
	}
	return nil
}

// readFull reads len(buf) bytes from the blocking socket fd; io.EOF when the
// peer closed before the first byte.
func readFull(fd int, buf []byte) error {
	for got := 0; got < len(buf); {
		n, err := unix.Read(fd, buf[got:])
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EAGAIN):
			return fmt.Errorf("no data for %s", pingPongTimeout)
		case err != nil:
			return err
		case n == 0 && got == 0:
			return io.EOF
		case n == 0:
			return io.ErrUnexpectedEOF
		}
		got += n
	}
	return nil
}

// writeFull writes buf to the blocking socket fd.
func writeFull(fd int, buf []byte) error {
	for sent := 0; sent < len(buf); {
		n, err := unix.Write(fd, buf[sent:])
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EAGAIN):
			return fmt.Errorf("could not send for %s", pingPongTimeout)
		case err != nil:
			return err
		}
		sent += n
	}
	return nil
}

func sockaddr(ap netip.AddrPort) unix.Sockaddr {
	if ap.Addr().Is4() {
		return &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}
	}
	return &unix.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()}
}

func addrOf(sa unix.Sockaddr) netip.Addr {
	switch sa := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrFrom4(sa.Addr)
	case *unix.SockaddrInet6:
		return netip.AddrFrom16(sa.Addr)
	}
	return netip.Addr{}
}

func sockPort(sa unix.Sockaddr) int {
	switch sa := sa.(type) {
	case *unix.SockaddrInet4:
		return sa.Port
	case *unix.SockaddrInet6:
		return sa.Port
	}
	return 0
}
