// Command pause is the sandbox ("pause") image's only program, built
// statically by package cri because no registry is reachable: it holds the
// pod's namespaces open and exits on SIGTERM or SIGINT, as the upstream pause
// does.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
}
