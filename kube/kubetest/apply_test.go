//go:build unix

package kubetest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/omnipd/omnipd/kube"
	"github.com/omnipd/omnipd/kube/kubetest"
	disaggv1 "sigs.k8s.io/lws/api/disaggregatedset/v1"
	"sigs.k8s.io/yaml"
)

// crdFile is the DisaggregatedSet CRD in the sigs.k8s.io/lws module omnipd
// builds against: the schema a cluster with that LWS release validates by.
const crdFile = "config/crd/bases/disaggregatedset.x-k8s.io_disaggregatedsets.yaml"

// TestGoldensApplyToARealAPIServer applies every object of every golden in
// kube/testdata to a real kube-apiserver (server-side apply, stored in
// etcd), each golden in its own namespace, and checks each object reads
// back with every field it was sent: an object the API server rejected,
// or a field a schema pruned, fails the test.
func TestGoldensApplyToARealAPIServer(t *testing.T) {
	srv := kubetest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	installCRD(ctx, t, srv)

	goldens, err := filepath.Glob("../testdata/*.yaml")
	if err != nil || len(goldens) == 0 {
		t.Fatalf("no goldens in ../testdata (%v)", err)
	}
	for _, golden := range goldens {
		name := strings.TrimSuffix(filepath.Base(golden), ".yaml")
		t.Run(name, func(t *testing.T) {
			b, err := os.ReadFile(golden)
			if err != nil {
				t.Fatal(err)
			}
			objs, err := kube.ReadYAML(bytes.NewReader(b))
			if err != nil {
				t.Fatalf("ReadYAML: %v", err)
			}
			ns := "golden-" + strings.ReplaceAll(name, "_", "-")
			apply(ctx, t, srv, map[string]any{
				"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": ns},
			})
			kinds := map[string]int{}
			for _, o := range objs {
				o.SetNamespace(ns)
				got := apply(ctx, t, srv, o)
				kind := o.GetObjectKind().GroupVersionKind().Kind
				kinds[kind]++
				if kind == "Service" {
					if ip, _ := dig(got, "spec", "clusterIP").(string); ip == "" {
						t.Errorf("Service %s: no cluster IP allocated", o.GetName())
					}
				}
			}
			// A pipeline with a Talker adds the stage worker's ConfigMaps
			// (its files, the vllm-omni deploy config), and a Service and a
			// workload for each of the Talker and Code2Wav.
			want := map[string]int{"ConfigMap": 1, "Service": 3, "workloads": 2}
			if strings.HasPrefix(name, "omni_") {
				want = map[string]int{"ConfigMap": 3, "Service": 4, "workloads": 3}
			}
			if kinds["ConfigMap"] != want["ConfigMap"] || kinds["Service"] < want["Service"] || kinds["DisaggregatedSet"]+kinds["Deployment"] < want["workloads"] {
				t.Errorf("applied %v; want %d ConfigMaps, at least %d Services (the roles' and the orchestrator's) and %d workloads", kinds, want["ConfigMap"], want["Service"], want["workloads"])
			}
		})
	}

	t.Run("the CRD validates", func(t *testing.T) {
		// Without the LWS webhook nothing defaults a role's startup
		// policy; the schema's enum must refuse it empty, which is why the
		// renderer sets it.
		objs, err := kube.ReadYAML(strings.NewReader(mustRead(t, "../testdata/xpyd_nixl.yaml")))
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range objs {
			ds, ok := o.(*disaggv1.DisaggregatedSet)
			if !ok {
				continue
			}
			ds.Namespace = "default"
			ds.Name = "no-startup-policy"
			ds.Spec.Roles[0].Spec.StartupPolicy = ""
			body, _ := json.Marshal(ds)
			_, err := srv.Apply(ctx, body)
			var se *kubetest.StatusError
			if !errors.As(err, &se) || se.Code != 422 || !strings.Contains(se.Message, "startupPolicy") {
				t.Fatalf("a role without a startup policy: err = %v, want 422 naming startupPolicy", err)
			}
			return
		}
		t.Fatal("no DisaggregatedSet in xpyd_nixl.yaml")
	})
}

// installCRD applies the DisaggregatedSet CRD from the module cache and
// waits until the API server serves it.
func installCRD(ctx context.Context, t *testing.T, srv *kubetest.Server) {
	t.Helper()
	out, err := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/lws").Output()
	if err != nil {
		t.Fatalf("go list -m sigs.k8s.io/lws: %v", err)
	}
	crdYAML, err := os.ReadFile(filepath.Join(strings.TrimSpace(string(out)), crdFile))
	if err != nil {
		t.Fatalf("the DisaggregatedSet CRD: %v", err)
	}
	crd, err := yaml.YAMLToJSON(crdYAML)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Apply(ctx, crd); err != nil {
		t.Fatalf("apply the DisaggregatedSet CRD: %v", err)
	}
	for {
		got, err := srv.Get(ctx, crd)
		if err != nil {
			t.Fatalf("read back the CRD: %v", err)
		}
		conds, _ := dig(got, "status", "conditions").([]any)
		for _, c := range conds {
			if c, _ := c.(map[string]any); c["type"] == "Established" && c["status"] == "True" {
				return
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the DisaggregatedSet CRD is not established: %v", conds)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// apply server-side applies obj, reads it back, and checks that the stored
// object has every field obj sets, with the same value.
func apply(ctx context.Context, t *testing.T, srv *kubetest.Server, obj any) map[string]any {
	t.Helper()
	body, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	var sent map[string]any
	if err := json.Unmarshal(body, &sent); err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("%v %v", sent["kind"], dig(sent, "metadata", "name"))
	if _, err := srv.Apply(ctx, body); err != nil {
		t.Fatalf("apply %s: %v", name, err)
	}
	got, err := srv.Get(ctx, body)
	if err != nil {
		t.Fatalf("read back %s: %v", name, err)
	}
	if dig(got, "metadata", "uid") == nil {
		t.Errorf("%s read back without a uid", name)
	}
	for _, d := range subset(sent, got, "") {
		t.Errorf("%s: %s", name, d)
	}
	return got
}

// subset lists where got lacks or differs from a field sent sets. Null and
// empty values in sent are the client's way of saying nothing, and status
// is the server's.
func subset(sent, got any, path string) []string {
	switch s := sent.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			return []string{fmt.Sprintf("%s: sent an object, read back %v", path, got)}
		}
		var diffs []string
		for k, v := range s {
			if path == "" && k == "status" || v == nil || isEmpty(v) {
				continue
			}
			gv, ok := g[k]
			if !ok {
				diffs = append(diffs, fmt.Sprintf("%s.%s: sent %v, absent when read back (pruned?)", path, k, v))
				continue
			}
			diffs = append(diffs, subset(v, gv, path+"."+k)...)
		}
		return diffs
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(s) {
			return []string{fmt.Sprintf("%s: sent %v, read back %v", path, sent, got)}
		}
		var diffs []string
		for i := range s {
			diffs = append(diffs, subset(s[i], g[i], fmt.Sprintf("%s[%d]", path, i))...)
		}
		return diffs
	}
	if !reflect.DeepEqual(sent, got) {
		return []string{fmt.Sprintf("%s: sent %v, read back %v", path, sent, got)}
	}
	return nil
}

func isEmpty(v any) bool {
	switch v := v.(type) {
	case map[string]any:
		return len(v) == 0
	case []any:
		return len(v) == 0
	}
	return false
}

func dig(m map[string]any, keys ...string) any {
	var v any = m
	for _, k := range keys {
		mm, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = mm[k]
	}
	return v
}

func mustRead(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
