package cluster

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"sync"
	"testing"
)

// The egress proxy answers the API server's CONNECT (as its HTTPConnect
// egress dialer sends it) by dialling a node's address in that node's
// namespace and any other address (a pod's, a Service's) in the first
// node's, then carries bytes both ways; a failed dial is a 502.
func TestEgressProxy(t *testing.T) {
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); io.Copy(c, c) }()
		}
	}()
	p, err := listenEgress(filepath.Join(t.TempDir(), "egress.sock"))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var dialled []string
	p.dial = func(ns, addr string) (net.Conn, error) {
		mu.Lock()
		dialled = append(dialled, ns+" "+addr)
		mu.Unlock()
		if ns == "down" {
			return nil, fmt.Errorf("connect: no route")
		}
		return net.Dial("tcp", echo.Addr().String())
	}
	p.serveNodes(map[netip.Addr]string{netip.MustParseAddr("172.16.2.11"): "ns-b1", netip.MustParseAddr("172.16.9.9"): "down"}, "ns-a1")
	defer p.close()

	connect := func(target string) (string, string) {
		t.Helper()
		c, err := net.Dial("unix", p.path)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: Go-http-client/1.1\r\n\r\n", target, target)
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusOK {
			return resp.Status, ""
		}
		fmt.Fprint(c, "hello\n")
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		return resp.Status, line
	}
	if status, got := connect("172.16.2.11:10250"); status != "200 Connection established" || got != "hello\n" {
		t.Errorf("CONNECT to b1's kubelet: %q, echo %q", status, got)
	}
	if status, got := connect("10.245.1.2:8080"); status != "200 Connection established" || got != "hello\n" {
		t.Errorf("CONNECT to a pod: %q, echo %q", status, got)
	}
	if status, _ := connect("172.16.9.9:10250"); status != "502 Bad Gateway" {
		t.Errorf("CONNECT that cannot dial: %q, want 502 Bad Gateway", status)
	}
	mu.Lock()
	defer mu.Unlock()
	want := []string{"ns-b1 172.16.2.11:10250", "ns-a1 10.245.1.2:8080", "down 172.16.9.9:10250"}
	if fmt.Sprint(dialled) != fmt.Sprint(want) {
		t.Errorf("dialled %v, want %v", dialled, want)
	}
}
