package testenv

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// NetstatCounter returns the counter name (as nstat names it, e.g.
// "TcpExtIPReversePathFilter": the section prefix, then the field) of the network
// namespace nsName, read from /proc/thread-self/net/netstat on a thread inside it.
func NetstatCounter(nsName, name string) (uint64, error) {
	var v uint64
	err := Do(nsName, func() error {
		b, err := os.ReadFile("/proc/thread-self/net/netstat")
		if err != nil {
			return err
		}
		got, ok := parseNetstat(string(b))[name]
		if !ok {
			return fmt.Errorf("no counter %s in /proc/net/netstat", name)
		}
		v = got
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("netstat of %s: %w", nsName, err)
	}
	return v, nil
}

// parseNetstat reads /proc/net/netstat's pairs of lines ("TcpExt: names...",
// "TcpExt: values...") into counters named section+field.
func parseNetstat(s string) map[string]uint64 {
	out := map[string]uint64{}
	sc := bufio.NewScanner(strings.NewReader(s))
	var names []string
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		section := strings.TrimSuffix(f[0], ":")
		if names == nil || names[0] != f[0] {
			names = f
			continue
		}
		for i := 1; i < len(f) && i < len(names); i++ {
			if v, err := strconv.ParseUint(f[i], 10, 64); err == nil {
				out[section+names[i]] = v
			}
		}
		names = nil
	}
	return out
}
