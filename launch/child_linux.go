package launch

import "syscall"

// childAttrs makes the kernel send SIGTERM to the worker when omnipd dies,
// however it dies, so no worker is orphaned; and puts the worker in its own
// process group, so that a Ctrl-C meant for omnipd does not kill the
// workers before omnipd has drained the requests they are serving.
func childAttrs() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM, Setpgid: true}
}
