package kube_test

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"flag"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/omnipd/omnipd/deploy"
	"github.com/omnipd/omnipd/kube"
	vllmomnistage "github.com/omnipd/omnipd/vllm-omni-stage"
	"github.com/omnipd/omnipd/vllmplan"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/labels"
	disaggv1 "sigs.k8s.io/lws/api/disaggregatedset/v1"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

const (
	thinkingFixture = "../deploy/testdata/fixtures/vllm-omni/qwen3_omni_moe_thinking.yaml"
	omniFixture     = "../deploy/testdata/fixtures/vllm-omni/qwen3_omni_moe.yaml"
)

// standInWorker stands for the stage worker's files in the goldens, which
// pin the objects' shape rather than the worker's sources; the ConfigMap a
// default rendering holds is checked against the embedded files instead
// (TestRenderStageWorkersCarryTheEmbeddedWorker).
var standInWorker = []vllmomnistage.File{
	{Name: "omnipd_stage/__init__.py", Data: []byte("\"\"\"stand-in for the stage worker's package\"\"\"\n")},
	{Name: "omnipd_stage/__main__.py", Data: []byte("import sys\nsys.exit(2)\n")},
}

// goldenCase is one golden file: a config, how it is loaded and rendered.
type goldenCase struct {
	name string
	path string
	load deploy.Options
	opts kube.Options
}

// goldenCases cover every connector the vllm plan's goldens cover, xPyD,
// the Deployment workload, and the pipeline with a Talker on stage workers.
func goldenCases() []goldenCase {
	var cases []goldenCase
	for _, c := range []string{"MooncakeConnector", "NixlConnector", "P2pNcclConnector", "LMCacheConnectorV1", "MoRIIOConnector"} {
		cases = append(cases, goldenCase{
			name: "thinking_pd_" + strings.ToLower(strings.TrimSuffix(c, "Connector")),
			path: thinkingFixture,
			load: deploy.Options{PD: true, Connector: c},
		})
	}
	return append(cases,
		goldenCase{name: "xpyd_nixl", path: "testdata/configs/xpyd_nixl.yaml"},
		goldenCase{name: "thinking_epd_nixl", path: "testdata/configs/thinking_epd_nixl.yaml"},
		goldenCase{name: "thinking_2e2p1d_mooncake", path: "testdata/configs/thinking_2e2p1d_mooncake.yaml"},
		goldenCase{
			name: "thinking_epd_nixl_deployment",
			path: "testdata/configs/thinking_epd_nixl.yaml",
			opts: kube.Options{Workload: kube.WorkloadDeployment, NamePrefix: "epd"},
		},
		goldenCase{name: "xpyd_mooncake", path: "testdata/configs/xpyd_nixl.yaml", load: deploy.Options{Connector: "MooncakeConnector"}},
		goldenCase{
			name: "thinking_pd_nixl_deployment",
			path: thinkingFixture,
			load: deploy.Options{PD: true, Connector: "NixlConnector"},
			opts: kube.Options{Workload: kube.WorkloadDeployment, Namespace: "llm", NamePrefix: "qwen-omni", VLLMImage: "vllm/vllm-openai:v0.19.0", Image: "registry.example/omnipd:v1"},
		},
		goldenCase{
			name: "omni_pd_nixl",
			path: omniFixture,
			load: deploy.Options{PD: true, Connector: "NixlConnector"},
			opts: kube.Options{WorkerFiles: standInWorker},
		},
		goldenCase{
			name: "omni_pd_mooncake_deployment",
			path: omniFixture,
			load: deploy.Options{PD: true, Connector: "MooncakeConnector"},
			opts: kube.Options{Workload: kube.WorkloadDeployment, Namespace: "voice", NamePrefix: "omni",
				StageImage: "registry.example/vllm-omni:v0.32.0", Image: "registry.example/omnipd:v1", WorkerFiles: standInWorker},
		},
		goldenCase{
			name: "omni_colocated_deployment",
			path: omniFixture,
			opts: kube.Options{Workload: kube.WorkloadDeployment, WorkerFiles: standInWorker},
		},
	)
}

func load(t *testing.T, path string, opts deploy.Options) *deploy.Document {
	t.Helper()
	doc, _, err := deploy.LoadFile(path, opts)
	if err != nil {
		t.Fatalf("load %s: %v", path, err)
	}
	return doc
}

func render(t *testing.T, doc *deploy.Document, opts kube.Options) ([]kube.Object, []byte) {
	t.Helper()
	objs, err := kube.Render(doc, opts)
	if err != nil {
		t.Fatalf("Render: %v", err)
	}
	notes, err := kube.Notes(doc, opts)
	if err != nil {
		t.Fatalf("Notes: %v", err)
	}
	var b bytes.Buffer
	if err := kube.WriteYAML(&b, objs, notes...); err != nil {
		t.Fatalf("WriteYAML: %v", err)
	}
	return objs, b.Bytes()
}

func TestRenderGolden(t *testing.T) {
	for _, c := range goldenCases() {
		t.Run(c.name, func(t *testing.T) {
			doc := load(t, c.path, c.load)
			objs, got := render(t, doc, c.opts)
			golden := filepath.Join("testdata", c.name+".yaml")
			if *update {
				if err := os.WriteFile(golden, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test ./kube -update)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("rendering differs from %s (run go test ./kube -update and review the diff)\ngot:\n%s", golden, got)
			}

			// The golden decodes, strictly, into the objects rendered.
			back, err := kube.ReadYAML(bytes.NewReader(want))
			if err != nil {
				t.Fatalf("ReadYAML(%s): %v", golden, err)
			}
			if len(back) != len(objs) {
				t.Fatalf("%s holds %d objects, Render gave %d", golden, len(back), len(objs))
			}
			for i := range objs {
				if !equality.Semantic.DeepEqual(back[i], objs[i]) {
					t.Errorf("object %d (%s) decoded from %s differs from the one rendered:\n%#v\n%#v", i, objs[i].GetName(), golden, back[i], objs[i])
				}
			}

			checkWiring(t, doc, c.opts, back)
		})
	}
}

// rendered sorts objects by kind.
type rendered struct {
	configMaps  []*corev1.ConfigMap
	services    []*corev1.Service
	deployments []*appsv1.Deployment
	sets        []*disaggv1.DisaggregatedSet
}

func sortObjects(t *testing.T, objs []kube.Object) rendered {
	t.Helper()
	var r rendered
	for _, o := range objs {
		switch o := o.(type) {
		case *corev1.ConfigMap:
			r.configMaps = append(r.configMaps, o)
		case *corev1.Service:
			r.services = append(r.services, o)
		case *appsv1.Deployment:
			r.deployments = append(r.deployments, o)
		case *disaggv1.DisaggregatedSet:
			r.sets = append(r.sets, o)
		default:
			t.Fatalf("unexpected object %T", o)
		}
	}
	return r
}

// pods is every pod template, with the number of pods run from it.
func (r rendered) pods() map[string]corev1.PodTemplateSpec {
	m := map[string]corev1.PodTemplateSpec{}
	for _, d := range r.deployments {
		m["deployment "+d.Name] = d.Spec.Template
	}
	for _, s := range r.sets {
		for _, role := range s.Spec.Roles {
			m["role "+role.Name] = role.Spec.LeaderWorkerTemplate.WorkerTemplate
		}
	}
	return m
}

// checkWiring checks what holds the objects together: each Service selects
// exactly one pod template and targets ports it has; the omnipd config loads
// and names each role's Service; the engines get the vllm plan's arguments
// and environment; pod counts and GPUs are the stage's.
func checkWiring(t *testing.T, doc *deploy.Document, opts kube.Options, objs []kube.Object) {
	t.Helper()
	r := sortObjects(t, objs)
	ns := opts.Namespace
	if ns == "" {
		ns = kube.DefaultNamespace
	}
	for _, o := range objs {
		if o.GetNamespace() != ns {
			t.Errorf("%s: namespace %q, want %q", o.GetName(), o.GetNamespace(), ns)
		}
		for _, k := range []string{"name", "component", "part-of", "managed-by"} {
			if o.GetLabels()["app.kubernetes.io/"+k] == "" {
				t.Errorf("%s: no app.kubernetes.io/%s label", o.GetName(), k)
			}
		}
	}
	workers := vllmplan.NeedsStageWorkers(doc)
	if wantCM := map[bool]int{false: 1, true: 3}[workers]; len(r.configMaps) != wantCM {
		t.Fatalf("%d ConfigMaps, want %d", len(r.configMaps), wantCM)
	}
	// The Talker and Code2Wav are Deployments beside the P/D pair's set.
	downstream := 0
	for _, s := range doc.Stages {
		if s.ModelStage != "thinker" {
			downstream++
		}
	}
	wantSets, wantDeployments := 1, 1+downstream
	if opts.Workload == kube.WorkloadDeployment {
		wantSets, wantDeployments = 0, 1+len(doc.Stages)
	}
	if len(r.sets) != wantSets || len(r.deployments) != wantDeployments {
		t.Fatalf("%d DisaggregatedSets and %d Deployments, want %d and %d", len(r.sets), len(r.deployments), wantSets, wantDeployments)
	}

	pods := r.pods()
	// podOf[service name] is the pod template the Service selects.
	podOf := map[string]corev1.PodTemplateSpec{}
	for _, svc := range r.services {
		var matched []string
		for name, p := range pods {
			if labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(p.Labels)) {
				matched = append(matched, name)
				podOf[svc.Name] = p
			}
		}
		if len(matched) != 1 {
			t.Errorf("Service %s selects %d pod templates %v, want 1", svc.Name, len(matched), matched)
			continue
		}
		c := podOf[svc.Name].Spec.Containers[0]
		for _, sp := range svc.Spec.Ports {
			if !slices.ContainsFunc(c.Ports, func(cp corev1.ContainerPort) bool {
				return cp.Name == sp.TargetPort.StrVal && cp.ContainerPort == sp.Port
			}) {
				t.Errorf("Service %s port %s targets %q, which container %s does not have on port %d", svc.Name, sp.Name, sp.TargetPort.StrVal, c.Name, sp.Port)
			}
		}
	}

	cm := r.configMaps[0]
	cfg, _, err := deploy.Load(kube.ConfigKey, []byte(cm.Data[kube.ConfigKey]), deploy.Options{})
	if err != nil {
		t.Fatalf("the ConfigMap's omnipd config does not load: %v", err)
	}
	vopts := vllmplan.VLLMOptions{Model: opts.Model, ServedModelName: opts.ServedModelName}
	if workers {
		vopts.StageWorkerDir = kube.StageWorkerDir
		vopts.StageDeployConfig = path.Join(kube.StageConfigDir, kube.StageConfigKey)
	}
	plan, err := vllmplan.PlanVLLM(doc, vopts)
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range cfg.Stages {
		if len(s.Replicas) != 1 || len(s.Endpoints) != 1 {
			t.Errorf("config stage %d: %d replicas, %d endpoints; want one, the role's Service", s.ID, len(s.Replicas), len(s.Endpoints))
			continue
		}
		var svc *corev1.Service
		for _, sv := range r.services {
			if s.Replicas[0].Endpoint == "http://"+sv.Name+"."+ns+".svc:8000" {
				svc = sv
			}
		}
		if svc == nil {
			t.Errorf("config stage %d: endpoint %q is no rendered Service", s.ID, s.Replicas[0].Endpoint)
			continue
		}
		if s.KV != nil && s.KV.IP != svc.Name+"."+ns+".svc" {
			t.Errorf("config stage %d: kv_ip %q, want the Service %s", s.ID, s.KV.IP, svc.Name)
		}
		pod := podOf[svc.Name]
		checkEngine(t, doc.Stages[i], s, pod, plan)
		if workers {
			checkStageWorkerPod(t, doc, opts, r, pod)
			// omnipd asks a Thinker pod for the layer it captures.
			if args := pod.Spec.Containers[0].Args; s.ModelStage == "thinker" {
				i := slices.Index(args, "--conditioning-layer")
				if v := s.EngineArgs.Get("accept_hidden_layer"); i < 0 || v == nil || args[i+1] != v.Value {
					t.Errorf("config stage %d: accept_hidden_layer %v; its pods' args %q", s.ID, v, args)
				}
			}
		}
		replicas := podCount(r, pod)
		if replicas != doc.Stages[i].NumReplicas {
			t.Errorf("stage %d: %d pods, want num_replicas %d", s.ID, replicas, doc.Stages[i].NumReplicas)
		}
	}

	orch := r.deployments[len(r.deployments)-1]
	c := orch.Spec.Template.Spec.Containers[0]
	if !slices.Contains(c.Command, "--served-model-name") || c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet == nil || c.ReadinessProbe.HTTPGet.Path != "/health" {
		t.Errorf("orchestrator container %v: want omnipd serve with --served-model-name and a /health readiness probe", c.Command)
	}
	if v := orch.Spec.Template.Spec.Volumes; len(v) != 1 || v[0].ConfigMap == nil || v[0].ConfigMap.Name != cm.Name {
		t.Errorf("orchestrator volumes %v: want the ConfigMap %s", v, cm.Name)
	}

	// The engines require the deployment secret omnipd sends them, and
	// omnipd the API key, both from the optional Secret.
	sent := secretRef(c, "OMNIPD_SECRET")
	if sent == nil || sent.Name != kube.SecretName(opts) || sent.Key != kube.SecretKeyDeployment || sent.Optional == nil || !*sent.Optional {
		t.Errorf("orchestrator OMNIPD_SECRET from %+v, want the optional key %s of Secret %s", sent, kube.SecretKeyDeployment, kube.SecretName(opts))
	}
	if ref := secretRef(c, "OMNIPD_API_KEY"); ref == nil || ref.Key != kube.SecretKeyAPIKey {
		t.Errorf("orchestrator OMNIPD_API_KEY from %+v, want key %s", ref, kube.SecretKeyAPIKey)
	}
	for name, p := range pods {
		if p.Labels["app.kubernetes.io/component"] == "orchestrator" {
			continue
		}
		if ref := secretRef(p.Spec.Containers[0], "VLLM_API_KEY"); !equality.Semantic.DeepEqual(ref, sent) {
			t.Errorf("%s: VLLM_API_KEY from %+v, want what omnipd sends, %+v", name, ref, sent)
		}
	}
}

// checkStageWorkerPod checks what a stage worker pod reads: the worker's
// package from the worker ConfigMap, mounted on its PYTHONPATH, holding
// exactly the worker's files; the vllm-omni deploy config, where its
// --deploy-config names it, holding the pipeline's; and the image for
// stage workers, with a hash of both that rolls the pods when one changes.
func checkStageWorkerPod(t *testing.T, doc *deploy.Document, opts kube.Options, r rendered, pod corev1.PodTemplateSpec) {
	t.Helper()
	c := pod.Spec.Containers[0]
	name := c.Args[slices.Index(c.Args, "--stage-id")+1]
	if want := cmp.Or(opts.StageImage, kube.DefaultStageImage); c.Image != want {
		t.Errorf("stage worker %s: image %s, want %s", name, c.Image, want)
	}
	if !slices.Equal(c.Command, []string{"python3", "-m", "omnipd_stage"}) {
		t.Errorf("stage worker %s: command %q", name, c.Command)
	}
	mounted := map[string]*corev1.ConfigMap{} // mount path -> ConfigMap
	for _, m := range c.VolumeMounts {
		i := slices.IndexFunc(pod.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == m.Name })
		if i < 0 || pod.Spec.Volumes[i].ConfigMap == nil {
			continue
		}
		j := slices.IndexFunc(r.configMaps, func(cm *corev1.ConfigMap) bool { return cm.Name == pod.Spec.Volumes[i].ConfigMap.Name })
		if j < 0 {
			t.Errorf("stage worker %s mounts ConfigMap %s, which is not rendered", name, pod.Spec.Volumes[i].ConfigMap.Name)
			continue
		}
		if !m.ReadOnly {
			t.Errorf("stage worker %s mounts %s writable", name, m.MountPath)
		}
		mounted[m.MountPath] = r.configMaps[j]
	}
	pythonPath := ""
	for _, e := range c.Env {
		if e.Name == "PYTHONPATH" {
			pythonPath = e.Value
		}
	}
	pkg := mounted[path.Join(strings.Split(pythonPath, ":")[0], "omnipd_stage")]
	if pkg == nil {
		t.Fatalf("stage worker %s: no ConfigMap mounted as omnipd_stage on PYTHONPATH %q (mounts %v)", name, pythonPath, c.VolumeMounts)
	}
	files := opts.WorkerFiles
	if files == nil {
		files = vllmomnistage.Files()
	}
	want := map[string]string{}
	for _, f := range files {
		want[f.Base()] = string(f.Data)
	}
	if !maps.Equal(pkg.Data, want) || len(pkg.BinaryData) > 0 {
		t.Errorf("stage worker ConfigMap %s holds %d files, want the worker's %d", pkg.Name, len(pkg.Data)+len(pkg.BinaryData), len(want))
	}
	cfgPath := c.Args[slices.Index(c.Args, "--deploy-config")+1]
	cfgMap := mounted[path.Dir(cfgPath)]
	wantCfg, err := vllmplan.StageDeployConfig(doc)
	if err != nil {
		t.Fatal(err)
	}
	if cfgMap == nil || cfgMap.Data[path.Base(cfgPath)] != string(wantCfg) {
		t.Errorf("stage worker %s: --deploy-config %s is not the pipeline's vllm-omni deploy config", name, cfgPath)
	}
	if pod.Annotations[kube.StageWorkerHashAnnotation] == "" {
		t.Errorf("stage worker %s: no %s annotation", name, kube.StageWorkerHashAnnotation)
	}
}

func secretRef(c corev1.Container, env string) *corev1.SecretKeySelector {
	for _, e := range c.Env {
		if e.Name == env && e.ValueFrom != nil {
			return e.ValueFrom.SecretKeyRef
		}
	}
	return nil
}

func podCount(r rendered, pod corev1.PodTemplateSpec) int {
	for _, d := range r.deployments {
		if equality.Semantic.DeepEqual(d.Spec.Template, pod) {
			return int(*d.Spec.Replicas)
		}
	}
	for _, s := range r.sets {
		for _, role := range s.Spec.Roles {
			if equality.Semantic.DeepEqual(role.Spec.LeaderWorkerTemplate.WorkerTemplate, pod) {
				return int(*role.Spec.Replicas) * int(*role.Spec.LeaderWorkerTemplate.Size)
			}
		}
	}
	return -1
}

// checkEngine checks a role's engine container against the vllm plan's
// command for the stage's first replica: the same arguments apart from the
// listening address and the replica's engine id and KV port, and the same
// environment apart from devices and per-pod values.
func checkEngine(t *testing.T, stage, cfgStage *deploy.Stage, pod corev1.PodTemplateSpec, plan *vllmplan.VLLMPlan) {
	t.Helper()
	var cmd *vllmplan.VLLMCommand
	for i := range plan.Commands {
		if plan.Commands[i].Stage == stage.ID && plan.Commands[i].Replica == 0 {
			cmd = &plan.Commands[i]
		}
	}
	if cmd == nil {
		t.Fatalf("stage %d: no planned vllm serve", stage.ID)
	}
	c := pod.Spec.Containers[0]
	got := append(slices.Clone(c.Command), c.Args...)
	want := slices.Clone(cmd.Argv)
	if len(got) != len(want) {
		t.Fatalf("stage %d: args\n%q\nwant the vllm plan's\n%q", stage.ID, got, want)
	}
	for i := range want {
		switch want[max(0, i-1)] {
		case "--host":
			want[i] = "0.0.0.0"
		case "--port":
			want[i] = "8000"
		case "--kv-transfer-config":
			checkKVConfig(t, stage, cfgStage, got[i], want[i])
			want[i] = got[i]
		case "--ec-transfer-config":
			checkECConfig(t, stage, cfgStage, got[i], want[i])
			want[i] = got[i]
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("stage %d: args\n%q\nwant\n%q", stage.ID, got, want)
	}

	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		env[e.Name] = e
	}
	for _, kv := range cmd.Env {
		k, v, _ := strings.Cut(kv, "=")
		e, ok := env[k]
		switch {
		case k == "CUDA_VISIBLE_DEVICES":
			if ok {
				t.Errorf("stage %d: CUDA_VISIBLE_DEVICES=%q set; the device plugin chooses GPUs", stage.ID, e.Value)
			}
		case k == "VLLM_NIXL_SIDE_CHANNEL_HOST", k == "VLLM_HOST_IP":
			if !ok || e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "status.podIP" {
				t.Errorf("stage %d: %s = %+v, want the pod IP", stage.ID, k, e)
			}
		case strings.HasSuffix(k, "_PORT"):
			// The replica's port on one host; the role's fixed port here.
			if !ok || e.Value != itoa(stage.Replicas[0].KVPort) {
				t.Errorf("stage %d: %s = %+v, want %d", stage.ID, k, e, stage.Replicas[0].KVPort)
			}
		default:
			if !ok || e.Value != v {
				t.Errorf("stage %d: %s = %+v, want %q as the vllm plan", stage.ID, k, e, v)
			}
		}
	}
	// One pod runs all of an instance's ranks: TP × DP GPUs.
	gpus := max(1, stage.TensorParallelSize) * max(1, stage.DataParallelSize)
	for what, l := range map[string]corev1.ResourceList{"requests": c.Resources.Requests, "limits": c.Resources.Limits} {
		if q := l[kube.GPUResource]; q.Value() != int64(gpus) {
			t.Errorf("stage %d: %s %s %s, want %d (tensor_parallel_size %d × data_parallel_size %d)",
				stage.ID, what, kube.GPUResource, q.String(), gpus, stage.TensorParallelSize, stage.DataParallelSize)
		}
	}
	if p := c.ReadinessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/health" || p.HTTPGet.Port.StrVal != "http" {
		t.Errorf("stage %d: readiness probe %+v, want GET /health on http", stage.ID, p)
	}
	if c.LivenessProbe == nil || c.StartupProbe == nil {
		t.Errorf("stage %d: want liveness and startup probes", stage.ID)
	}
}

// checkKVConfig: the kv_transfer_config is the plan's but for the engine id
// (the pod's name for NIXL, else the stage's, which the omnipd config
// names) and the KV port (the role's fixed one).
func checkKVConfig(t *testing.T, stage, cfgStage *deploy.Stage, got, want string) {
	t.Helper()
	var g, w map[string]any
	if err := json.Unmarshal([]byte(got), &g); err != nil {
		t.Fatalf("stage %d: --kv-transfer-config %s: %v", stage.ID, got, err)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatal(err)
	}
	wantID := cfgStage.Replicas[0].EngineID
	if stage.KV.Connector == "NixlConnector" {
		wantID = "$(POD_NAME)"
	}
	if g["engine_id"] != wantID {
		t.Errorf("stage %d: engine_id %v, want %q", stage.ID, g["engine_id"], wantID)
	}
	if _, ok := w["kv_port"]; ok {
		w["kv_port"] = float64(stage.Replicas[0].KVPort)
	}
	if x, ok := w["kv_connector_extra_config"].(map[string]any); ok {
		if _, ok := x["mooncake_bootstrap_port"]; ok {
			x["mooncake_bootstrap_port"] = float64(stage.Replicas[0].KVPort)
		}
		if _, ok := x["http_port"]; ok {
			x["http_port"] = float64(8000) // MoRIIO's: the pod's API port
		}
	}
	w["engine_id"] = g["engine_id"]
	gb, _ := json.Marshal(g)
	wb, _ := json.Marshal(w)
	if !bytes.Equal(gb, wb) {
		t.Errorf("stage %d: --kv-transfer-config %s, want %s", stage.ID, gb, wb)
	}
}

// checkECConfig: the ec_transfer_config is the plan's but for the engine id:
// an encoder pod answers to the stage's, as the omnipd config names it; a
// prefill pod to its KV engine id (the pod's name for NIXL).
func checkECConfig(t *testing.T, stage, cfgStage *deploy.Stage, got, want string) {
	t.Helper()
	var g, w map[string]any
	if err := json.Unmarshal([]byte(got), &g); err != nil {
		t.Fatalf("stage %d: --ec-transfer-config %s: %v", stage.ID, got, err)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatal(err)
	}
	wantID := cfgStage.Replicas[0].EngineID
	if stage.KV != nil && stage.KV.Connector == "NixlConnector" {
		wantID = "$(POD_NAME)"
	}
	if g["engine_id"] != wantID {
		t.Errorf("stage %d: ec engine_id %v, want %q", stage.ID, g["engine_id"], wantID)
	}
	w["engine_id"] = g["engine_id"]
	gb, _ := json.Marshal(g)
	wb, _ := json.Marshal(w)
	if !bytes.Equal(gb, wb) {
		t.Errorf("stage %d: --ec-transfer-config %s, want %s", stage.ID, gb, wb)
	}
}

func itoa(i int) string {
	b, _ := json.Marshal(i)
	return string(b)
}

// What the goldens hold in place of the worker's sources: a rendering with
// the default options carries the files this omnipd embeds, runs them in
// vllm-omni's image of the release they are written against, and its pods
// roll when the files change.
func TestRenderStageWorkersCarryTheEmbeddedWorker(t *testing.T) {
	doc := load(t, omniFixture, deploy.Options{PD: true, Connector: "NixlConnector"})
	objs, err := kube.Render(doc, kube.Options{})
	if err != nil {
		t.Fatal(err)
	}
	checkWiring(t, doc, kube.Options{}, objs)
	stand, err := kube.Render(doc, kube.Options{WorkerFiles: standInWorker})
	if err != nil {
		t.Fatal(err)
	}
	hash := func(objs []kube.Object) string {
		return sortObjects(t, objs).pods()["deployment omnipd-talker"].Annotations[kube.StageWorkerHashAnnotation]
	}
	if hash(objs) == "" || hash(objs) == hash(stand) {
		t.Errorf("the pods' %s is %q with the embedded worker and %q with another: want it to change with the files", kube.StageWorkerHashAnnotation, hash(objs), hash(stand))
	}
	if kube.DefaultStageImage != "vllm/vllm-omni:v"+vllmomnistage.VLLMOmniVersion {
		t.Errorf("default stage image %s is not vllm-omni's of release %s", kube.DefaultStageImage, vllmomnistage.VLLMOmniVersion)
	}
}

// A Talker pipeline is refused where the vllm target refuses it, with its
// advice: an encoder stage in front of it has no stage worker yet.
func TestRenderRefusesTalkerWithEncoder(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "epd.yaml")
	abs, err := filepath.Abs(omniFixture)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfg, []byte("base_config: "+abs+"\npd:\n  connector: NixlConnector\n  encoder: {}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	doc := load(t, cfg, deploy.Options{})
	_, err = kube.Render(doc, kube.Options{})
	_, vllmErr := vllmplan.PlanVLLM(doc, vllmplan.VLLMOptions{})
	if err == nil || vllmErr == nil || err.Error() != vllmErr.Error() {
		t.Errorf("Render: %v; want the vllm target's refusal, %v", err, vllmErr)
	}
}

func TestRenderRefusesReferenceConnector(t *testing.T) {
	doc := load(t, thinkingFixture, deploy.Options{PD: true, Connector: "ReferenceConnector"})
	_, err := kube.Render(doc, kube.Options{})
	if err == nil || !strings.Contains(err.Error(), "not a vLLM KV connector") {
		t.Fatalf("err = %v, want the reference connector refused", err)
	}
}

// LMCache's PD mode names loopback addresses on both sides (the receiver's
// pd_peer_host, the senders' pd_proxy_host), which in a pod are the pod's
// own: rendering it would give engines that never exchange KV.
func TestRenderRefusesLMCachePD(t *testing.T) {
	doc := load(t, "testdata/configs/lmcache_pd.yaml", deploy.Options{})
	for _, w := range []kube.Workload{kube.WorkloadDisaggregatedSet, kube.WorkloadDeployment} {
		_, err := kube.Render(doc, kube.Options{Workload: w})
		if !errors.Is(err, kube.ErrNotRenderable) || !strings.Contains(err.Error(), "lmcache.enable_pd") {
			t.Errorf("%s: err = %v, want ErrNotRenderable naming lmcache.enable_pd", w, err)
		}
		if _, err := kube.Notes(doc, kube.Options{Workload: w}); !errors.Is(err, kube.ErrNotRenderable) {
			t.Errorf("%s: Notes err = %v, want ErrNotRenderable", w, err)
		}
	}
}

func TestRenderColocatedThinker(t *testing.T) {
	doc := load(t, thinkingFixture, deploy.Options{})
	_, err := kube.Render(doc, kube.Options{})
	if !errors.Is(err, kube.ErrNotRenderable) || !strings.Contains(err.Error(), "--pd") {
		t.Fatalf("DisaggregatedSet of an unsplit Thinker: err = %v, want ErrNotRenderable suggesting --pd", err)
	}
	objs, err := kube.Render(doc, kube.Options{Workload: kube.WorkloadDeployment})
	if err != nil {
		t.Fatalf("Render --workload deployment: %v", err)
	}
	r := sortObjects(t, objs)
	if len(r.deployments) != 2 || r.deployments[0].Name != "omnipd-thinker" {
		t.Fatalf("deployments %v, want omnipd-thinker and the orchestrator", r.deployments)
	}
	args := r.deployments[0].Spec.Template.Spec.Containers[0].Args
	if slices.Contains(args, "--kv-transfer-config") {
		t.Errorf("colocated Thinker args %q carry a KV transfer config", args)
	}
	checkWiring(t, doc, kube.Options{Workload: kube.WorkloadDeployment}, objs)
}

// A data-parallel instance is one pod whose API server runs every DP rank
// (vllm serve --data-parallel-size N, on vllm serve and on the stage
// worker alike), so the pod asks for the GPUs of all of them: TP × DP.
func TestRenderDataParallelStageGPUs(t *testing.T) {
	for _, c := range []struct {
		name, path string
		workload   kube.Workload
	}{
		{"vllm serve", "testdata/configs/thinking_dp_nixl.yaml", kube.WorkloadDisaggregatedSet},
		{"stage worker", "testdata/configs/omni_dp_nixl.yaml", kube.WorkloadDeployment},
	} {
		t.Run(c.name, func(t *testing.T) {
			doc := load(t, c.path, deploy.Options{})
			opts := kube.Options{Workload: c.workload, WorkerFiles: standInWorker}
			objs, err := kube.Render(doc, opts)
			if err != nil {
				t.Fatal(err)
			}
			r := sortObjects(t, objs)
			thinkers := 0
			for name, pod := range r.pods() {
				if !strings.HasPrefix(pod.Labels["app.kubernetes.io/component"], "thinker-") {
					continue
				}
				thinkers++
				ctr := pod.Spec.Containers[0]
				if i := slices.Index(ctr.Args, "--data-parallel-size"); i < 0 || ctr.Args[i+1] != "2" {
					t.Errorf("%s: args %q; want --data-parallel-size 2", name, ctr.Args)
				}
				for what, l := range map[string]corev1.ResourceList{"requests": ctr.Resources.Requests, "limits": ctr.Resources.Limits} {
					if q := l[kube.GPUResource]; q.Value() != 4 {
						t.Errorf("%s: %s %s %s; want 4, tensor_parallel_size 2 × data_parallel_size 2", name, what, kube.GPUResource, q.String())
					}
				}
			}
			if thinkers != 2 {
				t.Fatalf("%d Thinker pod templates; want the prefill's and the decode's", thinkers)
			}
			checkWiring(t, doc, opts, objs)
		})
	}
}

func TestRenderRefusesEndpoints(t *testing.T) {
	doc := load(t, "../deploy/testdata/expand/endpoints.yaml", deploy.Options{})
	_, err := kube.Render(doc, kube.Options{Workload: kube.WorkloadDeployment})
	if !errors.Is(err, kube.ErrNotRenderable) || !strings.Contains(err.Error(), "already runs at") {
		t.Fatalf("err = %v, want ErrNotRenderable naming the running replica", err)
	}
}

func TestRenderOptions(t *testing.T) {
	doc := load(t, thinkingFixture, deploy.Options{PD: true, Connector: "NixlConnector"})
	for _, o := range []kube.Options{
		{Namespace: "Not_A_Namespace"},
		{NamePrefix: "9starts-with-digit"},
		{NamePrefix: strings.Repeat("x", 64)},
		{Workload: "statefulset"},
	} {
		if _, err := kube.Render(doc, o); err == nil {
			t.Errorf("Render(%+v) succeeded, want an error", o)
		}
	}
}

// A $ the config writes stays literal: Kubernetes would otherwise expand
// $(VAR) in args and env values.
func TestRenderEscapesDollar(t *testing.T) {
	const cfg = `pipeline: qwen3_omni_moe_thinker
pd:
  connector: NixlConnector
stages:
  - stage_id: 0
    chat_template: "{{ '$(HOME)' }}"
    env:
      PRICE: "$(COST)$"
`
	doc, _, err := deploy.Load("dollar.yaml", []byte(cfg), deploy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	objs, err := kube.Render(doc, kube.Options{Workload: kube.WorkloadDeployment})
	if err != nil {
		t.Fatal(err)
	}
	c := sortObjects(t, objs).deployments[0].Spec.Template.Spec.Containers[0]
	if !slices.Contains(c.Args, "{{ '$$(HOME)' }}") {
		t.Errorf("args %q: want the chat template's $ doubled", c.Args)
	}
	if i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "PRICE" }); i < 0 || c.Env[i].Value != "$$(COST)$$" {
		t.Errorf("env %+v: want PRICE=$$(COST)$$", c.Env)
	}
	if i := slices.Index(c.Args, "--kv-transfer-config"); i < 0 || !strings.Contains(c.Args[i+1], `"engine_id":"$(POD_NAME)"`) {
		t.Errorf("args %q: want the engine id left to expand to the pod's name", c.Args)
	}
	if c.Env[0].Name != "POD_NAME" {
		t.Errorf("env %+v: POD_NAME must come first", c.Env)
	}
}

func TestNotes(t *testing.T) {
	doc := load(t, "testdata/configs/xpyd_nixl.yaml", deploy.Options{Connector: "MooncakeConnector"})
	notes, err := kube.Notes(doc, kube.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(notes, func(n string) bool { return strings.Contains(n, "2 prefill pods") && strings.Contains(n, "bootstrap") }) {
		t.Errorf("notes %q: want one on Mooncake's bootstrap server behind a Service of 2 prefill pods", notes)
	}
	doc = load(t, "testdata/configs/xpyd_nixl.yaml", deploy.Options{})
	if notes, _ = kube.Notes(doc, kube.Options{}); len(notes) != 0 {
		t.Errorf("NIXL xPyD notes %q, want none", notes)
	}
}
