package cli

import (
	"path/filepath"
	"slices"
	"testing"

	"github.com/omnipd/omnipd/reference/engine/kvcache"
	"github.com/omnipd/omnipd/reference/engine/model"
	"github.com/omnipd/omnipd/reference/engine/tokenizer"
)

// omnipd worker --model DIR serves a checkpoint written in Hugging Face's
// format exactly as the model it was saved from.
func TestLoadModelFromCheckpoint(t *testing.T) {
	dir := t.TempDir()
	if err := model.Default().Save(dir, "float32"); err != nil {
		t.Fatal(err)
	}
	if err := tokenizer.Default().Save(filepath.Join(dir, "tokenizer.json")); err != nil {
		t.Fatal(err)
	}
	m, tok, err := loadModel(dir)
	if err != nil {
		t.Fatal(err)
	}
	prompt := tok.ApplyChatTemplate([]tokenizer.Message{{Role: "user", Content: "héllo"}}, true)
	if !slices.Equal(prompt, tokenizer.Default().ApplyChatTemplate([]tokenizer.Message{{Role: "user", Content: "héllo"}}, true)) {
		t.Fatal("the saved tokenizer encodes differently")
	}
	logits := func(m *model.Model) []float32 {
		c, _ := kvcache.New(m.KVShape(16), 8)
		table, _ := c.Allocate(8)
		return m.Forward(c, table, 0, prompt, nil)
	}
	if !slices.Equal(logits(m), logits(model.Default())) {
		t.Error("the loaded checkpoint computes different logits")
	}
	if _, _, err := loadModel(t.TempDir()); err == nil {
		t.Error("an empty directory loaded")
	}
}
