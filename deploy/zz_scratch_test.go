package deploy_test

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/omnipd/omnipd/deploy"
)

func TestZZScratch(t *testing.T) {
	files, _ := filepath.Glob("/tmp/s/c/*.yaml")
	for _, f := range files {
		data, _ := os.ReadFile(f)
		start := time.Now()
		_, _, err := deploy.Load("deploy.yaml", data, deploy.Options{ReadFile: noFiles})
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		fmt.Printf("== %s %v heap=%dMB err=%.200v\n", filepath.Base(f), time.Since(start), m.HeapAlloc>>20, err)
	}
}
