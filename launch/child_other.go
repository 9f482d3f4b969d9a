//go:build !linux

package launch

import "syscall"

func childAttrs() *syscall.SysProcAttr { return nil }
