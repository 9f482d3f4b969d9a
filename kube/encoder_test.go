package kube_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/omnipd/omnipd/deploy"
	"github.com/omnipd/omnipd/kube"
	corev1 "k8s.io/api/core/v1"
)

// claimMount is where a pod template mounts the EC cache claim, if it does.
func claimMount(p corev1.PodTemplateSpec, claim string) (string, bool) {
	i := slices.IndexFunc(p.Spec.Volumes, func(v corev1.Volume) bool {
		return v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == claim
	})
	if i < 0 {
		return "", false
	}
	c := p.Spec.Containers[0]
	j := slices.IndexFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == p.Spec.Volumes[i].Name })
	if j < 0 {
		return "", false
	}
	return c.VolumeMounts[j].MountPath, true
}

// Under E/P/D the encoder is a role of its own beside prefill and decode,
// and the two ends of ECExampleConnector see one directory.
func TestRenderEncoder(t *testing.T) {
	doc := load(t, "testdata/configs/thinking_2e2p1d_mooncake.yaml", deploy.Options{})
	objs, err := kube.Render(doc, kube.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r := sortObjects(t, objs)
	var roles []string
	for _, role := range r.sets[0].Spec.Roles {
		roles = append(roles, role.Name)
	}
	if want := []string{"encoder", "prefill", "decode"}; !slices.Equal(roles, want) {
		t.Fatalf("DisaggregatedSet roles %v, want %v", roles, want)
	}
	claim := kube.ECCacheClaim(kube.Options{})
	pods := r.pods()
	for role, wantMount := range map[string]bool{"encoder": true, "prefill": true, "decode": false} {
		dir, ok := claimMount(pods["role "+role], claim)
		if ok != wantMount || ok && dir != deploy.ECExampleStoragePath {
			t.Errorf("%s pods mount claim %s at %q (%v); want it at %s: %v", role, claim, dir, ok, deploy.ECExampleStoragePath, wantMount)
		}
	}
	if n := *r.sets[0].Spec.Roles[0].Spec.Replicas; n != 2 {
		t.Errorf("%d encoder pods, want 2", n)
	}
	enc := pods["role encoder"].Spec.Containers[0]
	if i := slices.Index(enc.Args, "--ec-transfer-config"); i < 0 || !strings.Contains(enc.Args[i+1], `"ec_role":"ec_producer"`) || slices.Contains(enc.Args, "--kv-transfer-config") {
		t.Errorf("encoder args %q: want an ec_producer --ec-transfer-config and no KV", enc.Args)
	}
	notes, err := kube.Notes(doc, kube.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(notes, func(n string) bool {
		return strings.Contains(n, "PersistentVolumeClaim "+claim) && strings.Contains(n, "ReadWriteMany")
	}) {
		t.Errorf("notes %q do not ask for the claim %s", notes, claim)
	}
}

func TestRenderRefusesReferenceECConnector(t *testing.T) {
	doc, _, err := deploy.Load("ref_ec.yaml", []byte(`base_config: ../deploy/testdata/fixtures/vllm-omni/qwen3_omni_moe_thinking.yaml
pd:
  connector: NixlConnector
  encoder:
    ec_connector: ReferenceECConnector
`), deploy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kube.Render(doc, kube.Options{}); err == nil || !strings.Contains(err.Error(), "not a vLLM EC connector") {
		t.Fatalf("err = %v, want the reference EC connector refused", err)
	}
}
