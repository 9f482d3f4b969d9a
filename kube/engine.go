package kube

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/omnipd/omnipd/deploy"
	"github.com/omnipd/omnipd/kvconnector"
	"github.com/omnipd/omnipd/topology"
	"github.com/omnipd/omnipd/vllmplan"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	disaggv1 "sigs.k8s.io/lws/api/disaggregatedset/v1"
	lwsv1 "sigs.k8s.io/lws/api/leaderworkerset/v1"
)

// GPUResource is the extended resource an engine pod requests, one per
// rank of the instance it runs: tensor_parallel_size × data_parallel_size,
// as one vllm serve --data-parallel-size N runs N engines of TP ranks each.
const GPUResource corev1.ResourceName = "nvidia.com/gpu"

// podNameRef is how an argument names the pod's own name: Kubernetes
// expands $(VAR) in a container's args from its environment.
const podNameRef = "$(POD_NAME)"

// perPodEngineID reports whether the pods of a stage over connector each
// take their own engine id, their name: for connectors whose prefill
// names its engine id in every answer (kvconnector.Spec.EngineIDFromAnswer).
// A NIXL decode caches its handshake with a prefill under the prefill's
// engine id, so prefill pods sharing one id would have their KV read from
// whichever pod shook hands first; the id need not be known in advance.
//
// The other connectors keep the stage's engine id on every pod of a role:
// omnipd tells a Mooncake decode the prefill's engine id from the config
// (it sends both legs at once, before any response), so all prefill pods
// must answer to that one id; P2pNccl and LMCache do not route by it.
func perPodEngineID(connector string) bool {
	spec, _ := kvconnector.SpecOf(connector)
	return spec.EngineIDFromAnswer
}

// podAddressEnv are connector variables that must hold the pod's own
// address, read from the downward API, rather than the address the
// engine listens on (kvconnector.EnvVar.IsAddress): NIXL's side channel
// host is what the prefill puts in remote_host for the decode pod to
// connect to. P2pNccl binds its side channel on VLLM_HOST_IP, which must
// be an address of the pod (the peer reaches it through the role Service
// omnipd names in the request id).
var podAddressEnv = func() map[string]bool {
	m := map[string]bool{}
	for _, s := range kvconnector.Specs() {
		for _, e := range s.Env {
			if e.IsAddress() {
				m[e.Name] = true
			}
		}
	}
	return m
}()

// engineRole is one stage as a set of identical engine pods.
type engineRole struct {
	stage *deploy.Stage
	// name is the name of the role's Service and Deployment.
	name string
	// component is the app.kubernetes.io/component label ("thinker-prefill").
	component string
	// engineID is the engine id the pods answer to in omnipd's config.
	engineID string
	// kvPort is the port of the KV side channel the engine listens on; 0
	// when its connector listens on none.
	kvPort int
	// host is the Service's DNS name, url its base URL.
	host, url string
	// ecStore is the directory the role's EC connector shares with the
	// other end (ECExampleConnector's shared_storage_path), which its pods
	// mount from the EC cache claim; "" when it shares none.
	ecStore string
	// worker is what the pods of a stage worker share; nil for vllm serve.
	worker    *stageWorker
	container corev1.Container
}

func engineRoles(doc *deploy.Document, opts Options, worker *stageWorker) ([]*engineRole, error) {
	if err := checkThinkerStages(doc, opts); err != nil {
		return nil, err
	}
	roles := make([]*engineRole, 0, len(doc.Stages))
	for _, s := range doc.Stages {
		r, err := newEngineRole(doc, s, opts, worker)
		if err != nil {
			return nil, err
		}
		roles = append(roles, r)
	}
	return roles, nil
}

// newEngineRole builds the container of stage s's pods: vllm serve, or the
// stage worker when worker is not nil. Every pod of a role
// runs one pod template, so what the vllm plan varies between replicas on
// one host varies here by pod, or not at all:
//   - the HTTP port is EnginePort and the KV port the stage's first
//     replica's, in every pod (each pod has its own address);
//   - devices are whatever the device plugin hands the pod, so no
//     CUDA_VISIBLE_DEVICES;
//   - the engine id is the stage's, or the pod's name (perPodEngineID);
//   - variables naming the pod's own address come from status.podIP.
func newEngineRole(doc *deploy.Document, s *deploy.Stage, opts Options, worker *stageWorker) (*engineRole, error) {
	if len(s.Replicas) == 0 {
		return nil, fmt.Errorf("stage %d has no replicas", s.ID)
	}
	component := s.ModelStage
	if s.Role != topology.RoleFull {
		component += "-" + s.Role.String()
	}
	name := opts.NamePrefix + "-" + component
	r := &engineRole{
		stage:     s,
		name:      name,
		component: component,
		host:      serviceHost(opts, name),
		url:       serviceURL(opts, name, EnginePort),
		worker:    worker,
	}

	first := s.Replicas[0]
	tmpl := topology.Replica{KVPort: first.KVPort}
	if s.KV != nil {
		r.engineID = s.KV.EngineID
		if r.engineID == "" {
			r.engineID = first.EngineID
		}
		tmpl.EngineID = r.engineID
		if perPodEngineID(s.KV.Connector) {
			tmpl.EngineID = podNameRef
		}
		r.kvPort = listeningKVPort(s, first)
		if r.kvPort == EnginePort {
			return nil, fmt.Errorf("%w: stage %d: KV port %d is the engines' HTTP port; choose another kv_port", ErrNotRenderable, s.ID, r.kvPort)
		}
	} else if s.EC != nil {
		// An encoder: every pod answers to the stage's EC engine id, as
		// the omnipd config names it (an encoder's outputs are found by
		// content hash, not by the engine that made them).
		r.engineID = s.EC.EngineID
		if r.engineID == "" {
			r.engineID = first.EngineID
		}
		tmpl.EngineID = r.engineID
	}
	r.ecStore, _ = deploy.ECSharedStorage(s)
	var (
		cmd     vllmplan.VLLMCommand
		err     error
		program = 2 // vllm serve: the container's command, before its args
	)
	if worker != nil {
		cmd, err = vllmplan.StageWorkerInstance(doc, s, 0, tmpl, EnginePort, opts.stageWorkerOptions())
		program = 3 // python3 -m omnipd_stage
	} else {
		cmd, err = vllmplan.VLLMInstance(s, 0, tmpl, EnginePort, vllmplan.VLLMOptions{
			Model:           opts.Model,
			Host:            "0.0.0.0",
			ServedModelName: opts.ServedModelName,
		})
	}
	if err != nil {
		return nil, err
	}

	// Kubernetes expands $(VAR) in args and env values; a $ the config
	// wrote is doubled to stay literal, and only the engine id reference
	// is left to expand.
	argv := make([]string, len(cmd.Argv))
	for i, a := range cmd.Argv {
		a = strings.ReplaceAll(a, "$", "$$")
		argv[i] = strings.ReplaceAll(a, `"engine_id":"$`+podNameRef+`"`, `"engine_id":"`+podNameRef+`"`)
	}
	var env []corev1.EnvVar
	if tmpl.EngineID == podNameRef {
		env = append(env, fieldEnv("POD_NAME", "metadata.name"))
	}
	for _, kv := range cmd.Env {
		k, v, _ := strings.Cut(kv, "=")
		switch {
		case k == "CUDA_VISIBLE_DEVICES":
			// The device plugin chooses the pod's GPUs.
		case podAddressEnv[k]:
			env = append(env, fieldEnv(k, "status.podIP"))
		default:
			env = append(env, corev1.EnvVar{Name: k, Value: strings.ReplaceAll(v, "$", "$$")})
		}
	}
	// A gated model needs a Hugging Face token; with the deployment secret
	// the engine answers only omnipd (vllm serve checks VLLM_API_KEY on
	// /v1/*, not on /health).
	env = append(env,
		secretEnv(opts, "HF_TOKEN", SecretKeyHFToken),
		secretEnv(opts, "VLLM_API_KEY", SecretKeyDeployment))

	ports := []corev1.ContainerPort{{Name: "http", ContainerPort: EnginePort, Protocol: corev1.ProtocolTCP}}
	if r.kvPort != 0 {
		ports = append(ports, corev1.ContainerPort{Name: "kv", ContainerPort: int32(r.kvPort), Protocol: corev1.ProtocolTCP})
	}
	gpus := resource.MustParse(strconv.Itoa(max(1, s.TensorParallelSize) * max(1, s.DataParallelSize)))
	health := corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/health", Port: intstr.FromString("http")}}
	containerName, image := "vllm", opts.VLLMImage
	if worker != nil {
		containerName, image = "stage-worker", opts.StageImage
	}
	r.container = corev1.Container{
		Name:    containerName,
		Image:   image,
		Command: argv[:program],
		Args:    argv[program:],
		Env:     env,
		Ports:   ports,
		Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{GPUResource: gpus},
			Limits:   corev1.ResourceList{GPUResource: gpus},
		},
		// vllm serve opens its port only once the weights are loaded,
		// which can take many minutes: the startup probe allows 30, and
		// liveness starts after it.
		StartupProbe: &corev1.Probe{ProbeHandler: health, PeriodSeconds: 10, FailureThreshold: 180},
		// A dead engine answers /health with 503: out of its Service at
		// once, restarted after a minute.
		ReadinessProbe: &corev1.Probe{ProbeHandler: health, PeriodSeconds: 5, FailureThreshold: 2},
		LivenessProbe:  &corev1.Probe{ProbeHandler: health, PeriodSeconds: 10, TimeoutSeconds: 5, FailureThreshold: 6},
		VolumeMounts:   []corev1.VolumeMount{{Name: "dshm", MountPath: "/dev/shm"}},
	}
	if r.ecStore != "" {
		r.container.VolumeMounts = append(r.container.VolumeMounts, corev1.VolumeMount{Name: ecCacheVolume, MountPath: r.ecStore})
	}
	if worker != nil {
		r.container.VolumeMounts = append(r.container.VolumeMounts, worker.mounts()...)
	}
	return r, nil
}

// ecCacheVolume is the volume of the EC cache claim in encoder and prefill
// pods.
const ecCacheVolume = "ec-cache"

// Keys of the Secret SecretName names. Each is optional, and so is the
// Secret: pods start without them, and the variable they would set is
// unset.
const (
	// SecretKeyHFToken is the engines' HF_TOKEN, for gated models.
	SecretKeyHFToken = "hf-token"
	// SecretKeyDeployment is the deployment secret: the engines' VLLM_API_KEY
	// and omnipd's OMNIPD_SECRET, which omnipd sends on every stage call.
	SecretKeyDeployment = "deployment-secret"
	// SecretKeyAPIKey is omnipd's OMNIPD_API_KEY, which clients of the
	// public API must send.
	SecretKeyAPIKey = "api-key"
)

// SecretName is the Secret the pods read their credentials from, when it
// exists. omnipd renders no Secret: the values are the operator's.
func SecretName(o Options) string {
	o, _ = o.withDefaults()
	return o.NamePrefix + "-secrets"
}

func secretEnv(o Options, name, key string) corev1.EnvVar {
	return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{
		SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: SecretName(o)},
			Key:                  key,
			Optional:             new(true),
		},
	}}
}

// listeningKVPort is the port the engine of replica r listens on for its
// connector's side channel, where the vllm plan gives it one: the port of
// the connector's environment variable (kvconnector.EnvKVPort: NIXL's side
// channel, Mooncake's bootstrap server) on the sides that get it, else the
// kv_port of the kv_transfer_config (P2pNccl).
func listeningKVPort(s *deploy.Stage, r topology.Replica) int {
	spec, _ := kvconnector.SpecOf(s.KV.Connector)
	for _, e := range spec.Env {
		if e.From != kvconnector.EnvKVPort {
			continue
		}
		if deploy.OnSides(s, e.Sides) {
			return r.KVPort
		}
		return 0
	}
	if s.KV.Port != 0 {
		return r.KVPort
	}
	return 0
}

func fieldEnv(name, path string) corev1.EnvVar {
	return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{
		FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: path},
	}}
}

func (r *engineRole) labels(o Options) map[string]string {
	if r.worker != nil {
		return labels(o, stageWorkerName, r.component)
	}
	return labels(o, "vllm", r.component)
}

func (r *engineRole) podTemplate(o Options) corev1.PodTemplateSpec {
	// Tensor parallel workers share tensors through /dev/shm, which a
	// container otherwise gets 64 MiB of.
	volumes := []corev1.Volume{{
		Name:         "dshm",
		VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory}},
	}}
	if r.ecStore != "" {
		// The encoder pods write each media item's outputs where the
		// prefill pods read them, and the two may run on different nodes:
		// one claim, ReadWriteMany, which the operator provides.
		volumes = append(volumes, corev1.Volume{
			Name:         ecCacheVolume,
			VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: ECCacheClaim(o)}},
		})
	}
	tmpl := metav1.ObjectMeta{Labels: r.labels(o)}
	if r.worker != nil {
		volumes = append(volumes, r.worker.volumes(o)...)
		tmpl.Annotations = map[string]string{StageWorkerHashAnnotation: r.worker.hash}
	}
	return corev1.PodTemplateSpec{
		ObjectMeta: tmpl,
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{r.container},
			Volumes:    volumes,
		},
	}
}

// ECCacheClaim is the PersistentVolumeClaim that encoder and prefill pods
// mount at their EC connector's shared directory (ECExampleConnector's
// shared_storage_path): <prefix>-ec-cache. omnipd renders no claim: the
// storage class that gives ReadWriteMany volumes is the cluster's.
func ECCacheClaim(o Options) string {
	o, _ = o.withDefaults()
	return o.NamePrefix + "-ec-cache"
}

func (r *engineRole) replicas() *int32 {
	return new(int32(max(1, r.stage.NumReplicas)))
}

func (r *engineRole) service(o Options) *corev1.Service {
	ports := []corev1.ServicePort{{Name: "http", Port: EnginePort, TargetPort: intstr.FromString("http"), Protocol: corev1.ProtocolTCP}}
	if r.kvPort != 0 {
		ports = append(ports, corev1.ServicePort{Name: "kv", Port: int32(r.kvPort), TargetPort: intstr.FromString("kv"), Protocol: corev1.ProtocolTCP})
	}
	return &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: meta(o, r.name, r.labels(o)),
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeClusterIP,
			Selector: selector(o, r.component),
			Ports:    ports,
		},
	}
}

func (r *engineRole) deployment(o Options) *appsv1.Deployment {
	// No surge: a new engine pod needs GPUs of its own, which a full
	// cluster does not have until an old pod goes.
	surge, unavailable := intstr.FromInt32(0), intstr.FromInt32(1)
	return &appsv1.Deployment{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
		ObjectMeta: meta(o, r.name, r.labels(o)),
		Spec: appsv1.DeploymentSpec{
			Replicas: r.replicas(),
			Selector: &metav1.LabelSelector{MatchLabels: selector(o, r.component)},
			Strategy: appsv1.DeploymentStrategy{
				Type:          appsv1.RollingUpdateDeploymentStrategyType,
				RollingUpdate: &appsv1.RollingUpdateDeployment{MaxSurge: &surge, MaxUnavailable: &unavailable},
			},
			Template: r.podTemplate(o),
		},
	}
}

// disaggregatedSet runs the roles as one DisaggregatedSet, a role each,
// named after the Thinker's stage roles ("encoder" when there is one,
// "prefill", "decode"; a DisaggregatedSet takes 2 to 10 roles). Each role is
// a LeaderWorkerSet of single-pod groups (tensor parallelism stays within a
// pod). Nothing here relies on the LWS webhook's defaults: the rollout
// strategy and startup policy are set explicitly.
func disaggregatedSet(o Options, roles []*engineRole) *disaggv1.DisaggregatedSet {
	ds := &disaggv1.DisaggregatedSet{
		TypeMeta:   metav1.TypeMeta{APIVersion: disaggv1.GroupVersion.String(), Kind: "DisaggregatedSet"},
		ObjectMeta: meta(o, o.NamePrefix+"-thinker", labels(o, "vllm", "thinker")),
	}
	if len(roles) > 0 && roles[0].worker != nil {
		ds.Labels = labels(o, stageWorkerName, "thinker")
	}
	for _, r := range roles {
		ds.Spec.Roles = append(ds.Spec.Roles, disaggv1.DisaggregatedRoleSpec{
			Name: r.stage.Role.String(),
			LeaderWorkerSetTemplateSpec: lwsv1.LeaderWorkerSetTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: r.labels(o)},
				Spec: lwsv1.LeaderWorkerSetSpec{
					Replicas: r.replicas(),
					LeaderWorkerTemplate: lwsv1.LeaderWorkerTemplate{
						WorkerTemplate: r.podTemplate(o),
						Size:           new(int32(1)),
						RestartPolicy:  lwsv1.RecreateGroupOnPodRestart,
					},
					RolloutStrategy: lwsv1.RolloutStrategy{Type: lwsv1.RollingUpdateStrategyType},
					StartupPolicy:   lwsv1.LeaderCreatedStartupPolicy,
				},
			},
		})
	}
	return ds
}
