package main

import (
	"strings"
	"testing"
)

func TestChooseSource(t *testing.T) {
	inCluster := func(k string) string {
		if k == "KUBERNETES_SERVICE_HOST" {
			return "10.96.0.1"
		}
		return ""
	}
	outside := func(string) string { return "" }
	tests := []struct {
		name, dir, kubeconfig string
		getenv                func(string) string
		want                  objectSource
		wantErr               string
	}{
		{"objects", "/etc/isthmus", "", inCluster, objectSource{dir: "/etc/isthmus"}, ""},
		{"kubeconfig", "", "/root/.kube/config", outside, objectSource{kube: true, kubeconfig: "/root/.kube/config"}, ""},
		{"in-cluster", "", "", inCluster, objectSource{kube: true}, ""},
		{"both", "/etc/isthmus", "/root/.kube/config", inCluster, objectSource{}, "--objects and --kubeconfig are exclusive"},
		{"neither outside a cluster", "", "", outside, objectSource{}, "give --objects DIR or --kubeconfig FILE"},
	}
	for _, tt := range tests {
		got, err := chooseSource(tt.dir, tt.kubeconfig, tt.getenv)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%s: err %v, want one containing %q", tt.name, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("%s: got %+v, %v; want %+v", tt.name, got, err, tt.want)
		}
	}
}

func TestAgentFlagsExclusive(t *testing.T) {
	cmd := newAgentCmd()
	cmd.SetArgs([]string{"--node", "a1", "--objects", t.TempDir(), "--kubeconfig", "/nonexistent"})
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	err := cmd.Execute()
	if err == nil || !strings.Contains(err.Error(), "exclusive") {
		t.Errorf("agent with --objects and --kubeconfig: err %v, want exclusive", err)
	}
}
