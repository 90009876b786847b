package testenv

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
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
// starts with all of them up; the tests take them down later). It gives up,
// naming the peers still down, when ctx ends.
func (l *Lab) waitPeersUp(ctx context.Context) error {
	start := time.Now()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		var down []string
		for _, n := range l.Scenario.Nodes() {
			series, err := l.peersDown(ctx, n.Name)
			if err != nil {
				return fmt.Errorf("node %s: %w", n.Name, err)
			}
			for _, s := range series {
				down = append(down, n.Name+": "+s)
			}
		}
		if len(down) == 0 {
			if waited := time.Since(start); waited > time.Second {
				l.logf("lab %s: every agent finds every peer up, %s after the last was ready", l.Name, waited.Round(100*time.Millisecond))
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("health checks still find peers down: %s: %w", strings.Join(down, ", "), ctx.Err())
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
	var down []string
	for _, line := range strings.Split(body, "\n") {
		if series, ok := strings.CutSuffix(line, " 0"); ok && strings.HasPrefix(series, "isthmus_peer_up{") {
			down = append(down, series)
		}
	}
	return down, nil
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
