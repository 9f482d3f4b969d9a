package kube

import (
	"crypto/sha256"
	"encoding/hex"
	"path"
	"unicode/utf8"

	"github.com/omnipd/omnipd/deploy"
	vllmomnistage "github.com/omnipd/omnipd/vllm-omni-stage"
	"github.com/omnipd/omnipd/vllmplan"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A pipeline with a Talker runs every stage on omnipd's vllm-omni stage
// worker (vllmplan.StageWorkerInstance), in the vllm-omni image: the worker's
// Python package comes from a ConfigMap mounted on its PYTHONPATH, the
// vllm-omni deploy config it reads from another.

// DefaultStageImage is the image of the stage worker pods: vllm-omni's
// published CUDA image of the release the worker is written against
// (Docker Hub vllm/vllm-omni, tagged v<version>; it sets no entrypoint, so
// the pods name their command, as vllm-omni's installation guide does:
// docs/getting_started/installation/gpu/cuda.inc.md).
const DefaultStageImage = "vllm/vllm-omni:v" + vllmomnistage.VLLMOmniVersion

// Where a stage worker pod finds its files: StageWorkerDir is on its
// PYTHONPATH and holds the worker's package (the worker ConfigMap, mounted
// at StageWorkerDir/omnipd_stage); the vllm-omni deploy config is
// StageConfigKey in StageConfigDir.
const (
	StageWorkerDir = "/opt/omnipd-stage"
	StageConfigDir = "/etc/vllm-omni"
	StageConfigKey = "deploy.yaml"
)

// StageWorkerHashAnnotation on a stage worker's pod template is the SHA-256
// of the worker's files and the vllm-omni deploy config, so that changing
// either (another omnipd, another config) rolls the pods: a mounted
// ConfigMap's new content would otherwise reach running workers only in
// part, and never their imported modules.
const StageWorkerHashAnnotation = "omnipd/stage-worker-sha256"

const (
	stageWorkerVolume = "stage-worker"
	stageConfigVolume = "vllm-omni-config"
)

// stageWorker is what every stage worker pod of one rendering shares.
type stageWorker struct {
	files        []vllmomnistage.File
	deployConfig []byte
	hash         string
}

func newStageWorker(doc *deploy.Document, o Options) (*stageWorker, error) {
	cfg, err := vllmplan.StageDeployConfig(doc)
	if err != nil {
		return nil, err
	}
	w := &stageWorker{files: o.WorkerFiles, deployConfig: cfg}
	if w.files == nil {
		w.files = vllmomnistage.Files()
	}
	h := sha256.New()
	for _, f := range w.files {
		h.Write([]byte(f.Name))
		h.Write([]byte{0})
		h.Write(f.Data)
		h.Write([]byte{0})
	}
	h.Write(cfg)
	w.hash = hex.EncodeToString(h.Sum(nil))
	return w, nil
}

// StageWorkerConfigMap names the ConfigMap of the stage worker's files,
// and StageConfigMap the one of the vllm-omni deploy config.
func StageWorkerConfigMap(o Options) string {
	o, _ = o.withDefaults()
	return o.NamePrefix + "-stage-worker"
}

func StageConfigMap(o Options) string {
	o, _ = o.withDefaults()
	return o.NamePrefix + "-vllm-omni-config"
}

// configMaps holds the worker's files, each under its name in the package
// (a ConfigMap key holds no "/"), and the vllm-omni deploy config.
func (w *stageWorker) configMaps(o Options) []Object {
	files := &corev1.ConfigMap{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: meta(o, StageWorkerConfigMap(o), labels(o, stageWorkerName, stageWorkerComponent)),
	}
	for _, f := range w.files {
		if utf8.Valid(f.Data) {
			if files.Data == nil {
				files.Data = map[string]string{}
			}
			files.Data[f.Base()] = string(f.Data)
			continue
		}
		if files.BinaryData == nil {
			files.BinaryData = map[string][]byte{}
		}
		files.BinaryData[f.Base()] = f.Data
	}
	cfg := &corev1.ConfigMap{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: meta(o, StageConfigMap(o), labels(o, stageWorkerName, stageWorkerComponent)),
		Data:       map[string]string{StageConfigKey: string(w.deployConfig)},
	}
	return []Object{files, cfg}
}

// stageWorkerName and stageWorkerComponent label what belongs to the stage
// workers as a whole (their ConfigMaps); each pod is labelled with its
// stage's component.
const (
	stageWorkerName      = "vllm-omni"
	stageWorkerComponent = "stage-worker"
)

// mounts and volumes of a stage worker pod: the worker's package on
// PYTHONPATH and the deploy config, both read-only.
func (w *stageWorker) mounts() []corev1.VolumeMount {
	return []corev1.VolumeMount{
		{Name: stageWorkerVolume, MountPath: path.Join(StageWorkerDir, vllmomnistage.Package), ReadOnly: true},
		{Name: stageConfigVolume, MountPath: StageConfigDir, ReadOnly: true},
	}
}

func (w *stageWorker) volumes(o Options) []corev1.Volume {
	return []corev1.Volume{
		{Name: stageWorkerVolume, VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: StageWorkerConfigMap(o)},
		}}},
		{Name: stageConfigVolume, VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: StageConfigMap(o)},
		}}},
	}
}

// stageWorkerOptions are the vllm options of a stage worker pod.
func (o Options) stageWorkerOptions() vllmplan.VLLMOptions {
	v := o.vllm()
	v.Host = "0.0.0.0"
	v.StageWorkerDir = StageWorkerDir
	v.StageDeployConfig = path.Join(StageConfigDir, StageConfigKey)
	v.WorkerFiles = o.WorkerFiles
	v.ConditioningLayer = o.ConditioningLayer
	return v
}
