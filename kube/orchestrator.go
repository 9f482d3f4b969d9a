package kube

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"path"
	"slices"
	"strconv"

	"github.com/omnipd/omnipd/deploy"
	"github.com/omnipd/omnipd/topology"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// ConfigHashAnnotation on the orchestrator's pod template is the SHA-256 of
// its config, so that a changed config rolls the Deployment.
const ConfigHashAnnotation = "omnipd/config-sha256"

const orchestratorComponent = "orchestrator"

// omnipdConfig is doc with each Thinker stage pointing at its role's
// Service. omnipd sees a role as one instance, which the Service spreads
// over the role's pods: the stage has one replica, whose endpoint is the
// Service, whose engine id is the one its pods answer to, and whose KV side
// channel (kv_ip, kv_port) is the Service's kv port, for the connectors
// whose handoff names it.
func omnipdConfig(doc *deploy.Document, roles []*engineRole) ([]byte, error) {
	cp := *doc
	cp.Stages = make([]*deploy.Stage, len(doc.Stages))
	for i, s := range doc.Stages {
		r := roles[i]
		sc := *s
		first := s.Replicas[0]
		rep := topology.Replica{
			Devices:  slices.Clone(first.Devices),
			EngineID: r.engineID,
			KVPort:   first.KVPort,
			Endpoint: r.url,
		}
		sc.NumReplicas = 1
		sc.Devices = rep.Devices
		sc.Replicas = []topology.Replica{rep}
		sc.Endpoints = []string{rep.Endpoint}
		if s.KV != nil {
			kv := *s.KV
			kv.IP = r.host
			sc.KV = &kv
		}
		cp.Stages[i] = &sc
	}
	b, err := cp.Node().MarshalYAML()
	if err != nil {
		return nil, fmt.Errorf("print the omnipd config: %w", err)
	}
	// omnipd serve loads it as it is; a config it would refuse is a bug here.
	if _, _, err := deploy.Load(ConfigKey, b, deploy.Options{}); err != nil {
		return nil, fmt.Errorf("the rendered omnipd config does not load: %w", err)
	}
	return b, nil
}

func configMap(o Options, cfg []byte) *corev1.ConfigMap {
	return &corev1.ConfigMap{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: meta(o, configMapName(o), labels(o, "omnipd", orchestratorComponent)),
		Data:       map[string]string{ConfigKey: string(cfg)},
	}
}

func configMapName(o Options) string { return o.NamePrefix + "-config" }

func orchestratorService(o Options) *corev1.Service {
	return &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: meta(o, o.NamePrefix, labels(o, "omnipd", orchestratorComponent)),
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeClusterIP,
			Selector: selector(o, orchestratorComponent),
			Ports: []corev1.ServicePort{{
				Name: "http", Port: OrchestratorPort, TargetPort: intstr.FromString("http"), Protocol: corev1.ProtocolTCP,
			}},
		},
	}
}

func orchestratorDeployment(o Options, cfg []byte, colocated bool) *appsv1.Deployment {
	sum := sha256.Sum256(cfg)
	l := labels(o, "omnipd", orchestratorComponent)
	command := []string{"omnipd", "serve",
		"--config", path.Join(ConfigDir, ConfigKey),
		"--host", "0.0.0.0",
		"--port", strconv.Itoa(OrchestratorPort),
		// omnipd forwards the client's model name to the engines.
		"--served-model-name", o.ServedModelName,
	}
	if colocated {
		// serve splits a Thinker by default, and cannot split one that
		// runs at endpoints.
		command = append(command, "--pd=false")
	}
	c := corev1.Container{
		Name:    "omnipd",
		Image:   o.Image,
		Command: command,
		// The deployment secret omnipd sends the engines, and the API key
		// clients must send omnipd, from the optional Secret.
		Env: []corev1.EnvVar{
			secretEnv(o, "OMNIPD_SECRET", SecretKeyDeployment),
			secretEnv(o, "OMNIPD_API_KEY", SecretKeyAPIKey),
		},
		Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: OrchestratorPort, Protocol: corev1.ProtocolTCP}},
		// /health is ready only when every stage is: omnipd takes traffic
		// once the engines do. Liveness asks only that omnipd itself
		// answers, so that engines still loading never restart it.
		ReadinessProbe: &corev1.Probe{
			ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/health", Port: intstr.FromString("http")}},
			PeriodSeconds: 5,
		},
		LivenessProbe: &corev1.Probe{
			ProbeHandler:     corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromString("http")}},
			PeriodSeconds:    10,
			FailureThreshold: 3,
		},
		// A request keeps omnipd off the best-effort class that is evicted
		// first; it routes and streams, so a little is enough.
		Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
			corev1.ResourceCPU:    resource.MustParse("500m"),
			corev1.ResourceMemory: resource.MustParse("256Mi"),
		}},
		VolumeMounts: []corev1.VolumeMount{{Name: "config", MountPath: ConfigDir, ReadOnly: true}},
	}
	return &appsv1.Deployment{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
		ObjectMeta: meta(o, o.NamePrefix, l),
		Spec: appsv1.DeploymentSpec{
			Replicas: new(int32(1)),
			Selector: &metav1.LabelSelector{MatchLabels: selector(o, orchestratorComponent)},
			Strategy: appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{
					Labels:      l,
					Annotations: map[string]string{ConfigHashAnnotation: hex.EncodeToString(sum[:])},
				},
				Spec: corev1.PodSpec{
					Containers: []corev1.Container{c},
					Volumes: []corev1.Volume{{
						Name: "config",
						VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
							LocalObjectReference: corev1.LocalObjectReference{Name: configMapName(o)},
						}},
					}},
				},
			},
		},
	}
}
