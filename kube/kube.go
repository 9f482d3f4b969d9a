// Package kube renders a deploy config's topology as Kubernetes objects:
// the engines of the Thinker's prefill and decode roles, and of its encoder
// role under E/P/D (one LWS DisaggregatedSet with a role each, or a
// Deployment per role), a Deployment for each of the Talker and Code2Wav,
// a ClusterIP Service per role, and the omnipd orchestrator (a Deployment,
// its Service, and a ConfigMap holding the omnipd deploy config whose stage
// endpoints are the role Services). A text (thinker-only) pipeline runs on
// vllm serve; a pipeline with a Talker runs every stage on omnipd's
// vllm-omni stage worker, whose files and vllm-omni deploy config come from
// two more ConfigMaps (see stageworker.go). The engines get the same
// arguments and environment that omnipd plan --target vllm gives them; only
// addresses change (see engine.go).
//
// Objects are built from the typed API structs of k8s.io/api and
// sigs.k8s.io/lws and written as YAML. The package is pure: it contacts no
// cluster, and the same config and options always give the same bytes.
package kube

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/omnipd/omnipd/deploy"
	"github.com/omnipd/omnipd/kvconnector"
	"github.com/omnipd/omnipd/topology"
	vllmomnistage "github.com/omnipd/omnipd/vllm-omni-stage"
	"github.com/omnipd/omnipd/vllmplan"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Object is one rendered Kubernetes object: typed, with its apiVersion and
// kind set.
type Object interface {
	runtime.Object
	metav1.Object
}

// Workload is the kind of object that runs a role's engine pods.
type Workload string

const (
	// WorkloadDisaggregatedSet runs prefill and decode as the two named
	// roles of one LWS DisaggregatedSet (sigs.k8s.io/lws), which rolls
	// both out together. The cluster needs the LWS controller.
	WorkloadDisaggregatedSet Workload = "disaggregatedset"
	// WorkloadDeployment runs each role as a plain Deployment.
	WorkloadDeployment Workload = "deployment"
)

// Defaults of Options, and the fixed ports of the rendered containers.
const (
	DefaultNamespace       = "default"
	DefaultNamePrefix      = "omnipd"
	DefaultImageRepository = "ghcr.io/omnipd/omnipd"
	DefaultVLLMImage       = "vllm/vllm-openai:latest"
	// EnginePort is the HTTP port of every vllm serve container.
	EnginePort = 8000
	// OrchestratorPort is the HTTP port of the omnipd container.
	OrchestratorPort = 8000
	// ConfigDir is where the omnipd container mounts its ConfigMap, and
	// ConfigKey the file in it that omnipd serve --config reads.
	ConfigDir = "/etc/omnipd"
	ConfigKey = "deploy.yaml"
)

// Options say where and how the objects run. The zero value renders into
// namespace "default" with names starting "omnipd", a DisaggregatedSet, and
// the default images and model.
type Options struct {
	// Namespace of every object (default DefaultNamespace).
	Namespace string
	// NamePrefix starts every object's name (default DefaultNamePrefix).
	// Several renderings with different prefixes can share a namespace.
	NamePrefix string
	// Image is the omnipd image (default DefaultImageRepository:latest).
	Image string
	// VLLMImage is the image of the engine containers; it must have vllm on
	// its PATH (default DefaultVLLMImage).
	VLLMImage string
	// StageImage is the image of the stage worker containers of a pipeline
	// with a Talker; it must have python3 with vllm_omni importable
	// (default DefaultStageImage).
	StageImage string
	// WorkerFiles are the stage worker's files its ConfigMap holds (default
	// vllmomnistage.Files(), the ones this omnipd embeds).
	WorkerFiles []vllmomnistage.File
	// ConditioningLayer is the Thinker layer the Talker reads, as
	// vllmplan.VLLMOptions.ConditioningLayer (default there).
	ConditioningLayer int
	// Model is the checkpoint every engine serves (default
	// vllmplan.DefaultVLLMModel).
	Model string
	// ServedModelName is the model name the engines and omnipd accept
	// (default Model).
	ServedModelName string
	// Workload runs the engine pods (default WorkloadDisaggregatedSet).
	Workload Workload
}

func (o Options) withDefaults() (Options, error) {
	if o.Namespace == "" {
		o.Namespace = DefaultNamespace
	}
	if o.NamePrefix == "" {
		o.NamePrefix = DefaultNamePrefix
	}
	if o.Image == "" {
		o.Image = DefaultImageRepository + ":latest"
	}
	if o.VLLMImage == "" {
		o.VLLMImage = DefaultVLLMImage
	}
	if o.StageImage == "" {
		o.StageImage = DefaultStageImage
	}
	if o.Model == "" {
		o.Model = vllmplan.DefaultVLLMModel
	}
	if o.ServedModelName == "" {
		o.ServedModelName = o.Model
	}
	if o.Workload == "" {
		o.Workload = WorkloadDisaggregatedSet
	}
	if o.Workload != WorkloadDisaggregatedSet && o.Workload != WorkloadDeployment {
		return o, fmt.Errorf("workload %q: want %s or %s", o.Workload, WorkloadDisaggregatedSet, WorkloadDeployment)
	}
	if errs := validation.IsDNS1123Label(o.Namespace); len(errs) > 0 {
		return o, fmt.Errorf("namespace %q: %s", o.Namespace, strings.Join(errs, "; "))
	}
	// Service names are the strictest names rendered (DNS-1035 labels).
	if errs := validation.IsDNS1035Label(o.NamePrefix); len(errs) > 0 {
		return o, fmt.Errorf("name prefix %q: %s", o.NamePrefix, strings.Join(errs, "; "))
	}
	return o, nil
}

// ErrNotRenderable is returned for topologies the Kubernetes target cannot
// run as they are; the message says what to change. (What the vllm target
// refuses is refused here too, with its advice.)
var ErrNotRenderable = errors.New("cannot render for Kubernetes")

// Render builds the objects that run doc on Kubernetes, in the order to
// apply them: the ConfigMaps, the Services, the engine workloads, the
// orchestrator Deployment.
//
// What vllmplan.PlanVLLM refuses is refused, with its advice. With
// WorkloadDisaggregatedSet the Thinker must be split into prefill and
// decode (a pd: section or --pd); the Talker and Code2Wav, which are no
// role of the pair, are Deployments either way.
func Render(doc *deploy.Document, opts Options) ([]Object, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	// The vllm plan refuses what its engines cannot run; the same topology
	// cannot run on Kubernetes either.
	if _, err := vllmplan.PlanVLLM(doc, opts.planOptions(doc)); err != nil {
		return nil, err
	}
	var worker *stageWorker
	if vllmplan.NeedsStageWorkers(doc) {
		if worker, err = newStageWorker(doc, opts); err != nil {
			return nil, err
		}
	}
	roles, err := engineRoles(doc, opts, worker)
	if err != nil {
		return nil, err
	}
	served := doc
	if worker != nil {
		// omnipd asks the Thinker pods for the layer they capture.
		served = vllmplan.WithConditioningLayer(doc, vllmplan.ConditioningLayer(doc, opts.stageWorkerOptions()))
	}
	cfg, err := omnipdConfig(served, roles)
	if err != nil {
		return nil, err
	}

	objs := []Object{configMap(opts, cfg)}
	if worker != nil {
		objs = append(objs, worker.configMaps(opts)...)
	}
	for _, r := range roles {
		objs = append(objs, r.service(opts))
	}
	objs = append(objs, orchestratorService(opts))
	switch opts.Workload {
	case WorkloadDisaggregatedSet:
		var pair []*engineRole
		for _, r := range roles {
			if r.stage.ModelStage == "thinker" {
				pair = append(pair, r)
			}
		}
		objs = append(objs, disaggregatedSet(opts, pair))
		for _, r := range roles {
			if r.stage.ModelStage != "thinker" {
				objs = append(objs, r.deployment(opts))
			}
		}
	case WorkloadDeployment:
		for _, r := range roles {
			objs = append(objs, r.deployment(opts))
		}
	}
	colocated := !slices.ContainsFunc(doc.Stages, func(s *deploy.Stage) bool { return s.Role != topology.RoleFull })
	objs = append(objs, orchestratorDeployment(opts, cfg, colocated))
	return objs, nil
}

// Notes are what the operator should know about rendering doc: engine
// arguments not passed on (as the vllm plan notes them), and connectors
// that reach one pod of a role through its Service.
func Notes(doc *deploy.Document, opts Options) ([]string, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	plan, err := vllmplan.PlanVLLM(doc, opts.planOptions(doc))
	if err != nil {
		return nil, err
	}
	if err := checkThinkerStages(doc, opts); err != nil {
		return nil, err
	}
	// What remains of the vllm plan's notes is about engine arguments,
	// which the pods get as the plan gives them.
	notes := plan.Notes
	for _, s := range doc.Stages {
		if s.KV == nil || s.NumReplicas < 2 {
			continue
		}
		if spec, ok := kvconnector.SpecOf(s.KV.Connector); ok && spec.SharedAddress != "" {
			why := spec.SharedAddress
			notes = append(notes, fmt.Sprintf("stage %d: %d %s pods behind one Service: %s", s.ID, s.NumReplicas, s.Role, why))
		}
	}
	notes = append(notes, sharedDeviceNotes(doc)...)
	for _, s := range doc.Stages {
		if dir, ok := deploy.ECSharedStorage(s); ok && s.Role == topology.RoleEncoder {
			notes = append(notes, fmt.Sprintf("stage %d: the encoder and prefill pods share the encoder outputs through %s at %s (shared_storage_path): they mount PersistentVolumeClaim %s there, which you provide (ReadWriteMany: the pods may run on different nodes)",
				s.ID, s.EC.Connector, dir, ECCacheClaim(opts)))
		}
	}
	return notes, nil
}

func (o Options) vllm() vllmplan.VLLMOptions {
	return vllmplan.VLLMOptions{
		Model:           o.Model,
		ServedModelName: o.ServedModelName,
	}
}

// planOptions are the vllm plan's options for doc's engines in their pods.
func (o Options) planOptions(doc *deploy.Document) vllmplan.VLLMOptions {
	if vllmplan.NeedsStageWorkers(doc) {
		return o.stageWorkerOptions()
	}
	return o.vllm()
}

// sharedDeviceNotes say where stages the config lays out on one device
// each get GPUs of their own: the device plugin gives a GPU to one
// container, so the Talker and Code2Wav, which vllm-omni's layout puts on
// one device, take one each.
func sharedDeviceNotes(doc *deploy.Document) []string {
	var notes []string
	for i, a := range doc.Stages {
		for _, b := range doc.Stages[i+1:] {
			shared := slices.DeleteFunc(slices.Clone(a.Devices), func(d int) bool { return !slices.Contains(b.Devices, d) })
			if len(shared) > 0 {
				notes = append(notes, fmt.Sprintf("stages %d (%s) and %d (%s) share device %s in the config; on Kubernetes each pod asks for GPUs of its own (%s), so they take separate GPUs",
					a.ID, a.ModelStage, b.ID, b.ModelStage, topology.FormatDevices(shared), GPUResource))
			}
		}
	}
	return notes
}

// labels of every object of one component. The selector labels are the
// ones a Service or Deployment matches on.
func labels(o Options, name, component string) map[string]string {
	l := selector(o, component)
	l["app.kubernetes.io/name"] = name
	l["app.kubernetes.io/managed-by"] = "omnipd"
	return l
}

func selector(o Options, component string) map[string]string {
	return map[string]string{
		"app.kubernetes.io/part-of":   o.NamePrefix,
		"app.kubernetes.io/component": component,
	}
}

func meta(o Options, name string, l map[string]string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: name, Namespace: o.Namespace, Labels: l}
}

// serviceURL is the in-cluster base URL of Service name.
func serviceURL(o Options, name string, port int) string {
	return fmt.Sprintf("http://%s:%d", serviceHost(o, name), port)
}

func serviceHost(o Options, name string) string {
	return name + "." + o.Namespace + ".svc"
}

// checkThinkerStages refuses what the Kubernetes target cannot lay out: a
// replica that already runs elsewhere, and (for a DisaggregatedSet) a
// Thinker that is not split into prefill and decode.
func checkThinkerStages(doc *deploy.Document, opts Options) error {
	var prefill, decode int
	for _, s := range doc.Stages {
		for i, r := range s.Replicas {
			if r.Endpoint != "" {
				return fmt.Errorf("%w: stage %d replica %d already runs at %s; the Kubernetes target runs every replica itself, so remove the stage's endpoints", ErrNotRenderable, s.ID, i, r.Endpoint)
			}
		}
		if lmcachePD(s) {
			return fmt.Errorf("%w: stage %d: LMCacheConnectorV1 in PD mode (lmcache.enable_pd) is not rendered for Kubernetes yet: its receiver binds lmcache.pd_peer_host and its senders push their done notices to lmcache.pd_proxy_host, which would be each pod's own loopback; run LMCache in storage mode (drop lmcache.enable_pd) or use another connector", ErrNotRenderable, s.ID)
		}
		switch s.Role {
		case topology.RolePrefill:
			prefill++
		case topology.RoleDecode:
			decode++
		}
	}
	if opts.Workload == WorkloadDisaggregatedSet && (prefill != 1 || decode != 1) {
		return fmt.Errorf("%w: a DisaggregatedSet runs the Thinker's prefill and decode roles, and this config does not split the Thinker; add a pd: section or --pd, or render --workload %s", ErrNotRenderable, WorkloadDeployment)
	}
	return nil
}

// lmcachePD reports whether stage s runs LMCache's PD mode, read as LMCache
// and omnipd serve read it: lmcache.enable_pd true, or its spelling as a
// string, in the stage's kv_connector_extra_config. The Kubernetes target
// cannot address it yet: both sides name each other by loopback addresses
// (the decode's pd_peer_host is its kv_ip or 127.0.0.1, the prefills'
// pd_proxy_host is where serve binds), and LMCache's receiver binds
// pd_peer_host, which must be an address of its own pod.
func lmcachePD(s *deploy.Stage) bool { return deploy.LMCachePD(s) }
