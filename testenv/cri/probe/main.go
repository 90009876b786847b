// Command probe is the test image's program (package cri builds it
// statically): "probe serve ADDR" answers every HTTP request and every UDP
// datagram on ADDR with the source address it came from; "probe get URL"
// prints a server's HTTP answer, "probe udp HOST:PORT" its UDP one (and a
// datagram starting "seq " is echoed as it is), "probe udp-large HOST:PORT"
// the same for a datagram of LargeDatagram bytes (fragmented on the way), and
// "probe ping HOST" the source of the ICMP echo reply to one echo request,
// so a test sees both that two pods reach each other and which source
// arrived.
package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: probe serve ADDR | probe get URL | probe udp HOST:PORT | probe udp-large HOST:PORT | probe ping HOST")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(os.Args[2])
	case "get":
		err = get(os.Args[2])
	case "udp":
		err = udp(os.Args[2], []byte("probe"))
	case "udp-large":
		err = udp(os.Args[2], append([]byte("probe"), make([]byte, LargeDatagram-5)...))
	case "ping":
		err = ping(os.Args[2])
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "probe:", err)
		os.Exit(1)
	}
}

// serve answers "source <ip>\n" with the peer address of each HTTP request
// and each UDP datagram, except that a datagram starting "seq " comes back
// as it is (a stream whose losses the sender counts).
func serve(addr string) error {
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		return err
	}
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				continue
			}
			if strings.HasPrefix(string(buf[:n]), "seq ") {
				pc.WriteTo(buf[:n], from)
				continue
			}
			pc.WriteTo([]byte(fmt.Sprintf("source %s\n", from.(*net.UDPAddr).IP)), from)
		}
	}()
	return http.ListenAndServe(addr, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, err := net.SplitHostPort(r.RemoteAddr)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		fmt.Fprintf(w, "source %s\n", host)
	}))
}

// get prints the body of one GET, bounded to 5 seconds.
func get(url string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("get %s: %s", url, resp.Status)
	}
	_, err = io.Copy(os.Stdout, resp.Body)
	return err
}

// LargeDatagram is udp-large's datagram size: more than any pod MTU, so it
// leaves the pod in fragments, and less than serve's buffer.
const LargeDatagram = 2000

// udp sends the datagram msg to addr and prints the answer, trying three
// times a second apart.
func udp(addr string, msg []byte) error {
	c, err := net.Dial("udp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	buf := make([]byte, 2048)
	for try := 0; try < 3; try++ {
		if _, err := c.Write(msg); err != nil {
			return err
		}
		c.SetReadDeadline(time.Now().Add(time.Second))
		n, err := c.Read(buf)
		if err == nil {
			_, err = os.Stdout.Write(buf[:n])
			return err
		}
	}
	return fmt.Errorf("udp %s: no answer to three datagrams", addr)
}

// ping sends ICMP echo requests to host (a raw socket: the container runs
// as root with CAP_NET_RAW) until a reply to one of them arrives, at most
// three a second apart, and prints "reply from <source>".
func ping(host string) error {
	dst, err := net.ResolveIPAddr("ip4", host)
	if err != nil {
		return err
	}
	c, err := net.ListenIP("ip4:icmp", nil)
	if err != nil {
		return err
	}
	defer c.Close()
	id := os.Getpid() & 0xffff
	buf := make([]byte, 2048)
	for seq := 1; seq <= 3; seq++ {
		// Echo request: type 8, code 0, checksum, identifier, sequence, data.
		msg := []byte{8, 0, 0, 0, byte(id >> 8), byte(id), 0, byte(seq), 'p', 'r', 'o', 'b', 'e'}
		sum := 0
		for i := 0; i < len(msg)-1; i += 2 {
			sum += int(msg[i])<<8 | int(msg[i+1])
		}
		if len(msg)%2 == 1 {
			sum += int(msg[len(msg)-1]) << 8
		}
		for sum > 0xffff {
			sum = sum>>16 + sum&0xffff
		}
		msg[2], msg[3] = byte(^sum>>8), byte(^sum)
		if _, err := c.WriteTo(msg, dst); err != nil {
			return err
		}
		deadline := time.Now().Add(time.Second)
		for {
			c.SetReadDeadline(deadline)
			n, from, err := c.ReadFrom(buf)
			if err != nil {
				break
			}
			// An echo reply (type 0) to this identifier.
			if n >= 8 && buf[0] == 0 && int(buf[4])<<8|int(buf[5]) == id {
				fmt.Printf("reply from %s\n", from.(*net.IPAddr).IP)
				return nil
			}
		}
	}
	return fmt.Errorf("ping %s: no echo reply to three requests", host)
}
