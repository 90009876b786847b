package main

import (
	"strings"
	"testing"
)

// TestControllerCmdFlags checks the flags are checked before any API server
// is dialed.
func TestControllerCmdFlags(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--tunnel-cidr", "fd00::/64"}, "parse --tunnel-cidr"},
		{[]string{"--tunnel-cidr", "100.64.0.0/31"}, "parse --tunnel-cidr"},
		{[]string{"--tunnel-cidr", "bogus"}, "parse --tunnel-cidr"},
		{[]string{"--kubeconfig", "/nonexistent/kubeconfig"}, "load kubeconfig /nonexistent/kubeconfig"},
		{[]string{"extra"}, "unknown command"},
	}
	for _, tt := range tests {
		cmd := newControllerCmd()
		cmd.SetArgs(tt.args)
		cmd.SilenceUsage, cmd.SilenceErrors = true, true
		err := cmd.Execute()
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("controller %v: err = %v, want it to contain %q", tt.args, err, tt.want)
		}
	}
	f := newControllerCmd().Flags()
	for name, def := range map[string]string{"namespace": "isthmus-system", "tunnel-cidr": "100.64.0.0/16", "leader-elect": "true", "kubeconfig": "",
		"kube-api-qps": "50", "kube-api-burst": "100", "patch-workers": "8"} {
		if fl := f.Lookup(name); fl == nil || fl.DefValue != def {
			t.Errorf("flag --%s: %+v, want default %q", name, fl, def)
		}
	}
}
