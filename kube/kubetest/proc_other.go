//go:build unix && !linux

package kubetest

import "syscall"

// processAttrs puts a child in its own process group, so that stopping it
// stops what it started.
func processAttrs() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
