//go:build unix

// Package kubetest runs a real etcd and kube-apiserver on loopback for
// tests that must know whether the API server accepts what omnipd renders.
// The binaries come from scripts/kube-assets.sh, found through the
// OMNIPD_KUBE_ASSETS environment variable; without it Start skips the test.
//
// Both processes run in their own process group in a temporary directory,
// on ephemeral loopback ports, and are killed when the test ends. Clients
// authenticate with a certificate of the system:masters group.
package kubetest

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// AssetsEnv names the directory holding the etcd and kube-apiserver binaries.
const AssetsEnv = "OMNIPD_KUBE_ASSETS"

// Bounds on starting and stopping. A cold kube-apiserver on a busy
// 2-core machine takes tens of seconds to become ready.
const (
	startTimeout = 3 * time.Minute
	stopTimeout  = 15 * time.Second
	pollEvery    = 200 * time.Millisecond
)

// Server is a running kube-apiserver backed by its own etcd.
type Server struct {
	// URL is the API server's base URL, https://127.0.0.1:PORT.
	URL string
	// Client trusts the server's certificate and authenticates as a
	// member of system:masters.
	Client *http.Client
}

// Start starts etcd and kube-apiserver and returns once the API server is
// ready. It skips t when OMNIPD_KUBE_ASSETS is unset, and fails it when the
// variable names a directory without the binaries or a process does not
// come up in time. Both processes are stopped by t.Cleanup.
func Start(t testing.TB) *Server {
	t.Helper()
	assets := os.Getenv(AssetsEnv)
	if assets == "" {
		t.Skipf("%s is not set; build the binaries with scripts/kube-assets.sh and run with %s=\"$(scripts/kube-assets.sh)\" (scripts/test.sh does)", AssetsEnv, AssetsEnv)
	}
	etcdBin, apiBin := filepath.Join(assets, "etcd"), filepath.Join(assets, "kube-apiserver")
	for _, b := range []string{etcdBin, apiBin} {
		if _, err := os.Stat(b); err != nil {
			t.Fatalf("%s=%s: %v (run scripts/kube-assets.sh)", AssetsEnv, assets, err)
		}
	}
	dir := t.TempDir()
	p, err := newPKI(dir)
	if err != nil {
		t.Fatalf("certificates: %v", err)
	}
	ports, err := freePorts(3)
	if err != nil {
		t.Fatalf("ports: %v", err)
	}
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(ports[0])
	peerURL := "http://127.0.0.1:" + strconv.Itoa(ports[1])
	apiPort := strconv.Itoa(ports[2])

	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()

	etcd := startProcess(t, dir, "etcd", etcdBin,
		"--name", "default",
		"--data-dir", filepath.Join(dir, "etcd-data"),
		"--listen-client-urls", etcdURL,
		"--advertise-client-urls", etcdURL,
		"--listen-peer-urls", peerURL,
		"--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "default="+peerURL,
		// A test's data need not survive a crash.
		"--unsafe-no-fsync",
		"--log-level", "warn",
	)
	plain := &http.Client{Timeout: 5 * time.Second}
	if err := waitFor(ctx, etcd, plain, etcdURL+"/health", func(body []byte) bool {
		return bytes.Contains(body, []byte(`"health":"true"`))
	}); err != nil {
		t.Fatalf("etcd: %v", err)
	}

	api := startProcess(t, dir, "kube-apiserver", apiBin,
		"--etcd-servers", etcdURL,
		"--bind-address", "127.0.0.1",
		"--advertise-address", "127.0.0.1",
		"--secure-port", apiPort,
		"--cert-dir", filepath.Join(dir, "apiserver-certs"),
		"--tls-cert-file", p.serverCert,
		"--tls-private-key-file", p.serverKey,
		"--client-ca-file", p.caCert,
		"--service-account-issuer", "https://127.0.0.1:"+apiPort,
		"--service-account-key-file", p.saKey,
		"--service-account-signing-key-file", p.saKey,
		// Only allocated to Services, never reached.
		"--service-cluster-ip-range", "10.0.0.0/24",
		"--authorization-mode", "RBAC",
		"--allow-privileged=true",
		"--endpoint-reconciler-type", "none",
		"--enable-priority-and-fairness=false",
		"--profiling=false",
	)
	s := &Server{
		URL: "https://127.0.0.1:" + apiPort,
		Client: &http.Client{
			Timeout: 30 * time.Second,
			Transport: &http.Transport{TLSClientConfig: &tls.Config{
				RootCAs:      p.pool,
				Certificates: []tls.Certificate{p.client},
				MinVersion:   tls.VersionTLS12,
			}},
		},
	}
	if err := waitFor(ctx, api, s.Client, s.URL+"/readyz", func(body []byte) bool {
		return string(body) == "ok"
	}); err != nil {
		t.Fatalf("kube-apiserver: %v", err)
	}
	return s
}

// process is a started binary and the channel closed when it exits.
type process struct {
	name   string
	cmd    *exec.Cmd
	exited chan struct{}
	log    string
}

// startProcess starts bin in its own process group, logging to a file in
// dir, and registers its stop with t.Cleanup: SIGTERM to the group, then
// SIGKILL if it has not exited within stopTimeout. Cleanups run last
// registered first, so the API server stops before its etcd.
func startProcess(t testing.TB, dir, name, bin string, args ...string) *process {
	t.Helper()
	logPath := filepath.Join(dir, name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = processAttrs()
	if err := cmd.Start(); err != nil {
		logFile.Close()
		t.Fatalf("start %s: %v", name, err)
	}
	p := &process{name: name, cmd: cmd, exited: make(chan struct{}), log: logPath}
	go func() {
		_ = cmd.Wait()
		logFile.Close()
		close(p.exited)
	}()
	t.Cleanup(func() {
		p.stop(t)
		if t.Failed() {
			t.Logf("%s log (last lines):\n%s", name, tail(logPath, 40))
		}
	})
	return p
}

func (p *process) stop(t testing.TB) {
	pgid := -p.cmd.Process.Pid
	_ = syscall.Kill(pgid, syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(stopTimeout):
		t.Logf("%s did not exit %s after SIGTERM; killing it", p.name, stopTimeout)
		_ = syscall.Kill(pgid, syscall.SIGKILL)
		<-p.exited
	}
	// Whatever it started goes with it.
	_ = syscall.Kill(pgid, syscall.SIGKILL)
}

// waitFor polls url until ok accepts a 200 response's body, the process
// exits, or ctx ends.
func waitFor(ctx context.Context, p *process, c *http.Client, url string, ok func([]byte) bool) error {
	var last string
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := c.Do(req)
		if err == nil {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && ok(body) {
				return nil
			}
			last = fmt.Sprintf("%s: %s", resp.Status, strings.TrimSpace(string(body)))
		} else {
			last = err.Error()
		}
		select {
		case <-p.exited:
			return fmt.Errorf("exited before it was ready (%s); log:\n%s", p.cmd.ProcessState, tail(p.log, 40))
		case <-ctx.Done():
			return fmt.Errorf("not ready at %s after %s (last: %s); log:\n%s", url, startTimeout, last, tail(p.log, 40))
		case <-time.After(pollEvery):
		}
	}
}

func freePorts(n int) ([]int, error) {
	var ports []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// StatusError is a response other than the one asked for, with the API
// server's Status message.
type StatusError struct {
	Code    int
	Message string
}

func (e *StatusError) Error() string { return fmt.Sprintf("HTTP %d: %s", e.Code, e.Message) }

// Apply server-side applies obj (JSON with apiVersion, kind and metadata),
// forcing conflicts as field manager "omnipd-test", and returns the object
// the server stored.
func (s *Server) Apply(ctx context.Context, obj []byte) (map[string]any, error) {
	path, err := objectPath(obj)
	if err != nil {
		return nil, err
	}
	q := url.Values{"fieldManager": {"omnipd-test"}, "force": {"true"}}
	return s.do(ctx, http.MethodPatch, path+"?"+q.Encode(), "application/apply-patch+yaml", obj)
}

// Get reads back the object obj names.
func (s *Server) Get(ctx context.Context, obj []byte) (map[string]any, error) {
	path, err := objectPath(obj)
	if err != nil {
		return nil, err
	}
	return s.do(ctx, http.MethodGet, path, "", nil)
}

func (s *Server) do(ctx context.Context, method, path, contentType string, body []byte) (map[string]any, error) {
	req, err := http.NewRequestWithContext(ctx, method, s.URL+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	req.Header.Set("Accept", "application/json")
	resp, err := s.Client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		var st struct{ Message string }
		if json.Unmarshal(b, &st) != nil || st.Message == "" {
			st.Message = string(b)
		}
		return nil, fmt.Errorf("%s %s: %w", method, path, &StatusError{Code: resp.StatusCode, Message: st.Message})
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	return m, nil
}

// clusterScoped kinds have no namespace in their path.
var clusterScoped = map[string]bool{"Namespace": true, "CustomResourceDefinition": true}

// objectPath is the REST path of the object obj describes. Resource names
// are the kind in lower case plus "s", which holds for every kind applied
// here.
func objectPath(obj []byte) (string, error) {
	var o struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name      string `json:"name"`
			Namespace string `json:"namespace"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(obj, &o); err != nil {
		return "", err
	}
	if o.APIVersion == "" || o.Kind == "" || o.Metadata.Name == "" {
		return "", errors.New("object without apiVersion, kind or name")
	}
	prefix := "/apis/" + o.APIVersion
	if !strings.Contains(o.APIVersion, "/") {
		prefix = "/api/" + o.APIVersion
	}
	if !clusterScoped[o.Kind] {
		if o.Metadata.Namespace == "" {
			return "", fmt.Errorf("%s %s has no namespace", o.Kind, o.Metadata.Name)
		}
		prefix += "/namespaces/" + o.Metadata.Namespace
	}
	return prefix + "/" + strings.ToLower(o.Kind) + "s/" + o.Metadata.Name, nil
}
