package testenv

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// agentMetricsAddr is where every agent of a lab serves /metrics, /healthz and
// /readyz in its node's namespace: the agent's default --metrics-addr, which
// the lab keeps.
const agentMetricsAddr = "127.0.0.1:9963"

// waitPeersUp waits until no agent of the lab reports a health-check target
// down (isthmus_peer_up 0). Agents start one after another: one that probes a
// gateway whose agent is not answering yet counts it down after
// --health-multiplier misses, and only --health-rise answers in a row bring it
// back. Until then the node sends nothing through that gateway, so a lab is not
// ready before its agents agree that every peer is up (every built-in scenario
// starts with all of them up; the tests take them down later). Every round asks
// every agent at once and keeps each one's last answer, so a slow agent on a
// loaded machine delays a round without voiding it. It gives up when ctx ends,
// naming the peers still down by the agents' last answers and the agents whose
// last scrape failed.
func (l *Lab) waitPeersUp(ctx context.Context) error {
	start := time.Now()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	nodes := l.Scenario.Nodes()
	down := make([][]string, len(nodes)) // by each agent's last answer
	failed := make([]error, len(nodes))  // each agent's last scrape, if it failed
	for {
		var wg sync.WaitGroup
		for i, n := range nodes {
			wg.Go(func() {
				series, err := l.peersDown(ctx, n.Name)
				if failed[i] = err; err == nil {
					down[i] = series
				}
			})
		}
		wg.Wait()
		var stillDown, noAnswer []string
		for i, n := range nodes {
			for _, s := range down[i] {
				stillDown = append(stillDown, n.Name+": "+s)
			}
			if failed[i] != nil {
				noAnswer = append(noAnswer, fmt.Sprintf("%s: %v", n.Name, failed[i]))
			}
		}
		if len(stillDown) == 0 && len(noAnswer) == 0 {
			if waited := time.Since(start); waited > time.Second {
				l.logf("lab %s: every agent finds every peer up, %s after the last was ready", l.Name, waited.Round(100*time.Millisecond))
			}
			return nil
		}
		select {
		case <-ctx.Done():
			var why []string
			if len(stillDown) > 0 {
				why = append(why, "health checks still find peers down: "+strings.Join(stillDown, ", "))
			}
			if len(noAnswer) > 0 {
				why = append(why, "no answer from agents: "+strings.Join(noAnswer, ", "))
			}
			return fmt.Errorf("%s: %w", strings.Join(why, "; "), ctx.Err())
		case <-tick.C:
		}
	}
}

// peersDown returns the isthmus_peer_up series at 0 in the /metrics of node's
// agent.
func (l *Lab) peersDown(ctx context.Context, node string) ([]string, error) {
	body, err := l.agentGet(ctx, node, "/metrics")
	if err != nil {
		return nil, err
	}
	return peerUpZero(body), nil
}

// peerUpZero returns the isthmus_peer_up series whose value is 0 in a
// Prometheus text exposition, as written there (name and labels).
func peerUpZero(exposition string) []string {
	var down []string
	for _, line := range strings.Split(exposition, "\n") {
		if !strings.HasPrefix(line, "isthmus_peer_up{") {
			continue
		}
		end := strings.LastIndexByte(line, '}')
		if end < 0 {
			continue
		}
		// The value, then an optional timestamp.
		fields := strings.Fields(line[end+1:])
		if len(fields) == 0 {
			continue
		}
		if v, err := strconv.ParseFloat(fields[0], 64); err == nil && v == 0 {
			down = append(down, line[:end+1])
		}
	}
	return down
}

// agentGet GETs path from node's agent and returns the body of a 200 answer.
func (l *Lab) agentGet(ctx context.Context, node, path string) (string, error) {
	code, body, err := l.AgentHTTP(ctx, node, path)
	if err != nil {
		return "", err
	}
	if code != http.StatusOK {
		return "", fmt.Errorf("GET %s: %d: %s", path, code, body)
	}
	return body, nil
}

// AgentHTTP GETs path (/metrics, /healthz, /readyz) from node's agent and
// returns the status code and body. The socket is opened in the node's
// namespace, then used from any thread.
func (l *Lab) AgentHTTP(ctx context.Context, node, path string) (int, string, error) {
	var conn net.Conn
	if err := Do(l.NodeNS(node), func() error {
		c, err := (&net.Dialer{Timeout: 2 * time.Second}).DialContext(ctx, "tcp", agentMetricsAddr)
		conn = c
		return err
	}); err != nil {
		return 0, "", fmt.Errorf("connect to the agent of %s: %w", node, err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://agent"+path, nil)
	if err != nil {
		return 0, "", err
	}
	req.Close = true
	if err := req.Write(conn); err != nil {
		return 0, "", fmt.Errorf("GET %s from %s: %w", path, node, err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), req)
	if err != nil {
		return 0, "", fmt.Errorf("GET %s from %s: %w", path, node, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, "", fmt.Errorf("GET %s from %s: %w", path, node, err)
	}
	return resp.StatusCode, string(body), nil
}
