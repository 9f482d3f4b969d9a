package kube

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	disaggv1 "sigs.k8s.io/lws/api/disaggregatedset/v1"
	"sigs.k8s.io/yaml"
)

// WriteYAML writes objs as one multi-document YAML stream, in order, each
// document started by "---", fields in sorted order, after a comment
// saying how to apply it and a "# note:" comment line per note. Fields
// only the API server fills in (status, creationTimestamp) are left out.
func WriteYAML(w io.Writer, objs []Object, notes ...string) error {
	var b bytes.Buffer
	b.WriteString("# Rendered by omnipd plan --target kubernetes; apply with kubectl apply -f FILE.\n")
	for _, n := range notes {
		b.WriteString("# note: " + strings.ReplaceAll(n, "\n", " ") + "\n")
	}
	for _, o := range objs {
		doc, err := objectYAML(o)
		if err != nil {
			return fmt.Errorf("%s %s: %w", o.GetObjectKind().GroupVersionKind().Kind, o.GetName(), err)
		}
		b.WriteString("---\n")
		b.Write(doc)
	}
	_, err := w.Write(b.Bytes())
	return err
}

func objectYAML(o Object) ([]byte, error) {
	raw, err := json.Marshal(o)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, err
	}
	dropNulls(m)
	delete(m, "status")
	return yaml.Marshal(m)
}

// dropNulls removes null fields: an unset pointer or time, which the API
// reads as absent anyway.
func dropNulls(v any) {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			if e == nil {
				delete(v, k)
				continue
			}
			dropNulls(e)
		}
	case []any:
		for _, e := range v {
			dropNulls(e)
		}
	}
}

// ReadYAML decodes a multi-document stream as WriteYAML writes it back into
// typed objects, strictly: an unknown or duplicate field, or a kind this
// package does not render, is an error naming the document.
func ReadYAML(r io.Reader) ([]Object, error) {
	yr := utilyaml.NewYAMLReader(bufio.NewReader(r))
	var objs []Object
	for n := 1; ; n++ {
		doc, err := yr.Read()
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", n, err)
		}
		if isBlank(doc) {
			continue
		}
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &tm); err != nil {
			return nil, fmt.Errorf("document %d: %w", n, err)
		}
		o, err := newObject(tm)
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", n, err)
		}
		if err := yaml.UnmarshalStrict(doc, o); err != nil {
			return nil, fmt.Errorf("document %d (%s): %w", n, tm.Kind, err)
		}
		objs = append(objs, o)
	}
}

func newObject(tm metav1.TypeMeta) (Object, error) {
	switch tm.APIVersion + "/" + tm.Kind {
	case "v1/ConfigMap":
		return &corev1.ConfigMap{}, nil
	case "v1/Service":
		return &corev1.Service{}, nil
	case "apps/v1/Deployment":
		return &appsv1.Deployment{}, nil
	case disaggv1.GroupVersion.String() + "/DisaggregatedSet":
		return &disaggv1.DisaggregatedSet{}, nil
	}
	return nil, fmt.Errorf("apiVersion %q kind %q is not a kind omnipd renders", tm.APIVersion, tm.Kind)
}

// isBlank: only comments and white space.
func isBlank(doc []byte) bool {
	for line := range strings.SplitSeq(string(doc), "\n") {
		line = strings.TrimSpace(line)
		if line != "" && !strings.HasPrefix(line, "#") && line != "---" {
			return false
		}
	}
	return true
}
