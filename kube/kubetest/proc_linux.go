package kubetest

import "syscall"

// processAttrs puts a child in its own process group, so that stopping it
// stops what it started, and has the kernel kill it when the test binary
// dies without running its cleanups (a panic, a -timeout).
func processAttrs() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
