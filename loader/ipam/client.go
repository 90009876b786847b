package ipam

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"time"
)

// DefaultSocket is where the agent serves IPAM on a node.
const DefaultSocket = "/run/isthmus/ipam.sock"

// The paths the agent serves on its socket (HTTP, JSON bodies).
const (
	PathAdd    = "/v1/add"
	PathStatus = "/v1/status"
)

// AddRequest asks the agent for the addresses of one attachment.
type AddRequest struct {
	Attachment
	NetNS     string `json:"netns"`
	HostIface string `json:"hostIface"`
	// IPs are addresses the runtime asks for (the CNI `ips` capability), at
	// most one per range; the others are chosen by the store.
	IPs []netip.Addr `json:"ips,omitempty"`
}

// AddResponse is what the pod gets: its addresses (host prefixes, /32 or
// /128), the verified ranges they came from, and the MTU of its interface
// (the site's tunnel MTU).
type AddResponse struct {
	Addrs  []netip.Prefix `json:"addrs"`
	Ranges []netip.Prefix `json:"ranges"`
	MTU    int            `json:"mtu"`
}

// Status is the agent's IPAM state: Ready only once the node's podCIDRs were
// verified against the API; Reason says why not otherwise.
type Status struct {
	Ready  bool           `json:"ready"`
	Reason string         `json:"reason,omitempty"`
	Ranges []netip.Prefix `json:"ranges,omitempty"`
	MTU    int            `json:"mtu,omitempty"`
	// Verified is when the ranges were last confirmed from the objects.
	Verified time.Time `json:"verified,omitzero"`
	// Outside are reservations outside the current ranges (a podCIDR that
	// changed under running pods): kept until their pods go.
	Outside []netip.Addr `json:"outside,omitempty"`
}

// Error is an error the agent answered with; Code is the CNI error code the
// plugin should return (types.ErrTryAgainLater, ErrPluginNotAvailable, ...).
type Error struct {
	Code uint   `json:"code"`
	Msg  string `json:"error"`
}

func (e *Error) Error() string { return e.Msg }

// CNI error codes (spec 1.1) the agent answers with; mirrored here so this
// package needs nothing from the CNI libraries.
const (
	CodeTryAgainLater      uint = 11
	CodePluginNotAvailable uint = 50
)

// ErrUnreachable wraps a failure to reach the agent at all.
var ErrUnreachable = errors.New("isthmus agent unreachable")

// Client talks to the agent's IPAM socket.
type Client struct {
	http *http.Client
}

// NewClient returns a client of the socket at path.
func NewClient(path string) *Client {
	return &Client{http: &http.Client{
		Timeout: 10 * time.Second,
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		}},
	}}
}

// Add reserves the attachment's addresses (or returns those it holds).
func (c *Client) Add(ctx context.Context, req AddRequest) (AddResponse, error) {
	var resp AddResponse
	return resp, c.do(ctx, http.MethodPost, PathAdd, req, &resp)
}

// Status returns the agent's IPAM state.
func (c *Client) Status(ctx context.Context) (Status, error) {
	var st Status
	return st, c.do(ctx, http.MethodGet, PathStatus, nil, &st)
}

func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("encode %s request: %w", path, err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://isthmus"+path, body)
	if err != nil {
		return fmt.Errorf("build %s request: %w", path, err)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrUnreachable, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("read %s answer: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		e := &Error{Code: CodeTryAgainLater}
		if json.Unmarshal(b, e) != nil || e.Msg == "" {
			e.Msg = fmt.Sprintf("%s: %s: %s", path, resp.Status, bytes.TrimSpace(b))
		}
		return e
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("decode %s answer: %w", path, err)
	}
	return nil
}
