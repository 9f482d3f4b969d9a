package launch

import "syscall"

// childAttrs makes the kernel send SIGTERM to the worker when omnipd dies,
// however it dies, so no worker is orphaned.
func childAttrs() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
}
