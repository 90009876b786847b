// Package fixture uses every form of running a program that the scanner in
// scan_test.go resolves, and two it cannot. It is parsed, never built.
package fixture

//go:generate go tool bpf2go -cc clang -target bpfel X x.c

const constProgram = "conststr"

var built string

func forms(ctx context.Context, l *testenv.Lab, ns string, argv []string) {
	exec.Command("uname", "-r")
	exec.CommandContext(ctx, "go", "build")
	exec.CommandContext(ctx, constProgram)
	testenv.Command(ctx, ns, "tshark", "-i", "eth0")
	testenv.Exec(ctx, ns, "iperf3", "--client")
	l.Exec(ctx, ns, "/usr/bin/python3", "-c", "import scapy")
	args := []string{"ping", "-c", "1"}
	args = append(args, "10.0.0.1")
	l.Exec(ctx, ns, args...)
	rule := append([]string{"iptables", "-w"}, argv...)
	l.Exec(ctx, ns, rule...)
	for _, c := range []struct {
		ns, want string
		argv     []string
	}{
		{"a", "b", []string{"sysctl", "net.ipv4.ip_forward"}},
		{ns: "a", argv: []string{"ethtool", "-k"}, want: "on"},
		{"a", "b", append([]string{"iptables-save"}, "-t", "nat")},
	} {
		l.Exec(ctx, c.ns, c.argv...)
	}
	for _, p := range []string{"rangeprog"} {
		exec.Command(p)
	}
	var tool = "bpftool"
	Command(ctx, ns, tool, "net")
	exec.Command("nsenter", "--net=x")
	exec.Command(built)            // not resolved: a binary a test built
	l.Exec(ctx, ns, computed()...) // not resolved: argv from a call
	strings.Join([]string{"not", "a", "program"}, " ")
	fmt.Sprint("Command", "Exec", "ignored")
}
