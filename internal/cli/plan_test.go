package cli

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"github.com/omnipd/omnipd/internal/buildinfo"
	"github.com/omnipd/omnipd/kube"
	appsv1 "k8s.io/api/apps/v1"
)

// The kubernetes target prints exactly the kube package's goldens, which
// the apiserver test applies to a real kube-apiserver.
func TestPlanKubernetesPrintsTheGolden(t *testing.T) {
	for _, c := range []struct {
		golden string
		args   []string
	}{
		{"thinking_pd_nixl", nil},
		{"thinking_pd_mooncake", []string{"--connector", "MooncakeConnector"}},
		{"thinking_pd_nixl_deployment", []string{
			"--workload", "deployment", "--namespace", "llm", "--name-prefix", "qwen-omni",
			"--vllm-image", "vllm/vllm-openai:v0.19.0", "--image", "registry.example/omnipd:v1",
		}},
	} {
		t.Run(c.golden, func(t *testing.T) {
			args := append([]string{"plan", "--target", "kubernetes", "--pd", "--connector", "NixlConnector"}, c.args...)
			code, out, errOut := run(t, append(args, fixtures+"qwen3_omni_moe_thinking.yaml")...)
			if code != 0 {
				t.Fatalf("exit %d, stderr:\n%s", code, errOut)
			}
			want, err := os.ReadFile("../../kube/testdata/" + c.golden + ".yaml")
			if err != nil {
				t.Fatal(err)
			}
			if out != string(want) {
				t.Errorf("stdout differs from kube/testdata/%s.yaml:\n%s", c.golden, out)
			}
			objs, err := kube.ReadYAML(strings.NewReader(out))
			if err != nil || len(objs) == 0 {
				t.Errorf("stdout does not decode into objects: %v", err)
			}
		})
	}
}

// The orchestrator's image is tagged with the build's version when that
// names a release, and is latest for a development build, whose version no
// published image carries (and whose "+dirty" no image tag may hold).
func TestPlanKubernetesImageFollowsVersion(t *testing.T) {
	for _, tc := range []struct {
		version, tag string
	}{
		{"v1.2.3", "v1.2.3"},
		{"dev", "latest"},
		{"v0.0.0-20261201100000-3b2af53c1e0f", "latest"},
		{"v0.4.0+dirty", "latest"},
	} {
		if got, want := imageFor(buildinfo.Info{Version: tc.version}), kube.DefaultImageRepository+":"+tc.tag; got != want {
			t.Errorf("version %s: image %s, want %s", tc.version, got, want)
		}
	}
	code, out, errOut := run(t, "plan", "--target", "kubernetes", "--pd", "--connector", "NixlConnector", fixtures+"qwen3_omni_moe_thinking.yaml")
	if code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", code, errOut)
	}
	if want := "image: " + imageFor(buildinfo.Read()) + "\n"; !strings.Contains(out, want) {
		t.Errorf("the orchestrator image is not this build's %q:\n%s", want, out)
	}
}

func TestPlanKubernetesRefuses(t *testing.T) {
	for _, c := range []struct {
		name string
		args []string
		want []string
	}{
		{"talker in front of an encoder", []string{"--pd", "--connector", "NixlConnector", "../../vllmplan/testdata/omni_epd.yaml"},
			[]string{"encoder stage", "--ec-transfer-config"}},
		{"unsplit thinker", []string{fixtures + "qwen3_omni_moe_thinking.yaml"},
			[]string{"--pd", "--workload deployment"}},
		{"host", []string{"--host", "0.0.0.0", "--pd", "--connector", "NixlConnector", fixtures + "qwen3_omni_moe_thinking.yaml"},
			[]string{"--host is for --target vllm"}},
		{"workload", []string{"--workload", "statefulset", "--pd", "--connector", "NixlConnector", fixtures + "qwen3_omni_moe_thinking.yaml"},
			[]string{"statefulset", "deployment"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, out, errOut := run(t, append([]string{"plan", "--target", "kubernetes"}, c.args...)...)
			if code == 0 {
				t.Fatalf("exit 0, want an error; stdout:\n%s", out)
			}
			for _, w := range c.want {
				if !strings.Contains(errOut, w) {
					t.Errorf("stderr %q does not say %q", errOut, w)
				}
			}
		})
	}
}

// The vllm target is the default, and prints the vllmplan package's golden.
func TestPlanVLLMUnchanged(t *testing.T) {
	code, out, errOut := run(t, "plan", "--pd", "--connector", "NixlConnector", fixtures+"qwen3_omni_moe_thinking.yaml")
	if code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", code, errOut)
	}
	want, err := os.ReadFile("../../vllmplan/testdata/vllm/thinking_pd_nixl.golden.sh")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal([]byte(out), want) {
		t.Errorf("stdout differs from vllmplan/testdata/vllm/thinking_pd_nixl.golden.sh:\n%s", out)
	}
	if code, _, errOut := run(t, "plan", "--workload", "deployment", fixtures+"qwen3_omni_moe_thinking.yaml"); code == 0 || !strings.Contains(errOut, "--workload is for --target kubernetes") {
		t.Errorf("--workload with --target vllm: exit %d, stderr %q", code, errOut)
	}
	if code, _, errOut := run(t, "plan", "--stage-image", "x", fixtures+"qwen3_omni_moe.yaml"); code == 0 || !strings.Contains(errOut, "--stage-image is for --target kubernetes") {
		t.Errorf("--stage-image with --target vllm: exit %d, stderr %q", code, errOut)
	}
}

// A pipeline with a Talker plans every stage on the vllm-omni stage worker,
// for one host and for Kubernetes; --stage-image picks the workers' image.
func TestPlanTalkerPipeline(t *testing.T) {
	code, out, errOut := run(t, "plan", "--pd", "--connector", "MooncakeConnector", fixtures+"qwen3_omni_moe.yaml")
	if code != 0 {
		t.Fatalf("plan --target vllm: exit %d, stderr:\n%s", code, errOut)
	}
	for _, want := range []string{"python3 -m omnipd_stage Qwen/Qwen3-Omni-30B-A3B-Instruct", "--stage-id 2", "cat > omnipd-vllm-omni.yaml", "cat > omnipd-stage/omnipd_stage/__init__.py"} {
		if !strings.Contains(out, want) {
			t.Errorf("the script lacks %q", want)
		}
	}
	code, out, errOut = run(t, "plan", "--target", "kubernetes", "--pd", "--connector", "NixlConnector", "--stage-image", "registry.example/vllm-omni:v0.32.0", fixtures+"qwen3_omni_moe.yaml")
	if code != 0 {
		t.Fatalf("plan --target kubernetes: exit %d, stderr:\n%s", code, errOut)
	}
	objs, err := kube.ReadYAML(strings.NewReader(out))
	if err != nil {
		t.Fatal(err)
	}
	images := map[string]bool{}
	for _, o := range objs {
		if d, ok := o.(*appsv1.Deployment); ok {
			images[d.Spec.Template.Spec.Containers[0].Image] = true
		}
	}
	if !images["registry.example/vllm-omni:v0.32.0"] || images[kube.DefaultStageImage] {
		t.Errorf("Deployment images %v: want the --stage-image for the Talker and Code2Wav", images)
	}
}
