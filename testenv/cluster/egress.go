package cluster

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"sync"
	"time"

	"github.com/isthmus-dev/isthmus/testenv"
)

// egressProxy is the HTTP CONNECT proxy on a unix socket through which the
// API server reaches the cluster (kube.Options.ClusterEgress). A connection
// to a node's address is dialled in that node's network namespace (the
// kubelet listens there); any other address (a pod's, a Service's) in the
// first node's, which routes the pod network through isthmus as any node
// does.
type egressProxy struct {
	path string
	ln   net.Listener
	wg   sync.WaitGroup

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	nodes map[netip.Addr]string // node address -> namespace
	first string                // the first node's namespace
	// dial opens a connection to addr from inside the network namespace ns.
	dial func(ns, addr string) (net.Conn, error)
}

// dialIn dials addr (TCP) on a thread in the network namespace ns; the
// socket stays there.
func dialIn(ns, addr string) (conn net.Conn, err error) {
	err = testenv.Do(ns, func() (err error) {
		conn, err = net.DialTimeout("tcp", addr, 10*time.Second)
		return err
	})
	return conn, err
}

// listenEgress listens on the unix socket path; serve starts answering.
func listenEgress(path string) (*egressProxy, error) {
	os.Remove(path)
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen for the API server's cluster egress: %w", err)
	}
	return &egressProxy{path: path, ln: ln, conns: map[net.Conn]struct{}{}, nodes: map[netip.Addr]string{}, dial: dialIn}, nil
}

// serve answers CONNECT requests for the nodes of lab until close.
func (p *egressProxy) serve(lab *testenv.Lab) {
	nodes := map[netip.Addr]string{}
	var first string
	for i, n := range lab.Scenario.Nodes() {
		nodes[n.Address] = lab.NodeNS(n.Name)
		if n.ExternalAddress.IsValid() {
			nodes[n.ExternalAddress] = lab.NodeNS(n.Name)
		}
		if i == 0 {
			first = lab.NodeNS(n.Name)
		}
	}
	p.serveNodes(nodes, first)
}

// serveNodes answers CONNECT requests until close, dialling a node address
// in its namespace (nodes) and any other address in first.
func (p *egressProxy) serveNodes(nodes map[netip.Addr]string, first string) {
	p.mu.Lock()
	p.nodes, p.first = nodes, first
	p.mu.Unlock()
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := p.ln.Accept()
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				time.Sleep(10 * time.Millisecond)
				continue
			}
			if !p.track(c) {
				c.Close()
				return
			}
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				defer p.untrack(c)
				p.handle(c)
			}()
		}
	}()
}

// namespaceFor returns the namespace to dial host from.
func (p *egressProxy) namespaceFor(host string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if a, err := netip.ParseAddr(host); err == nil {
		if ns, ok := p.nodes[a]; ok {
			return ns
		}
	}
	return p.first
}

// handle answers one CONNECT and then copies both ways until either side
// closes.
func (p *egressProxy) handle(c net.Conn) {
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	br := bufio.NewReader(c)
	req, err := http.ReadRequest(br)
	if err != nil {
		return
	}
	c.SetReadDeadline(time.Time{})
	if req.Method != http.MethodConnect {
		fmt.Fprintf(c, "HTTP/1.1 405 Method Not Allowed\r\n\r\n")
		return
	}
	host, _, err := net.SplitHostPort(req.Host)
	if err != nil {
		fmt.Fprintf(c, "HTTP/1.1 400 Bad Request\r\n\r\n")
		return
	}
	up, err := p.dial(p.namespaceFor(host), req.Host)
	if err != nil {
		fmt.Fprintf(c, "HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain\r\n\r\n%v\n", err)
		return
	}
	if !p.track(up) {
		up.Close()
		return
	}
	defer p.untrack(up)
	defer up.Close()
	if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	done := make(chan struct{}, 2)
	go func() {
		io.Copy(up, br) // what the reader holds already, then the rest
		if tc, ok := up.(*net.TCPConn); ok {
			tc.CloseWrite()
		}
		done <- struct{}{}
	}()
	go func() {
		io.Copy(c, up)
		if uc, ok := c.(*net.UnixConn); ok {
			uc.CloseWrite()
		}
		done <- struct{}{}
	}()
	<-done
	<-done
}

// track records an open connection for close; false once closed.
func (p *egressProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conns == nil {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *egressProxy) untrack(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.conns, c)
}

// close stops accepting, closes every open connection, waits for the
// handlers and removes the socket.
func (p *egressProxy) close() error {
	err := p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
	os.Remove(p.path)
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}
