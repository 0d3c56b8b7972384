// Package agent is the tool loop of the examples on anthropic-sdk-go: the model is offered
// minipy (with whatever host functions opts.Globals has), each tool_use it asks for is run
// in that namespace, the tool_result goes back (its text, and one image block per image the
// code showed: plots, display() of a picture), and the loop ends when the model answers.
package agent

import (
	"context"
	"encoding/base64"
	"errors"
	"strings"

	"github.com/anthropics/anthropic-sdk-go/v2"

	"github.com/minipy-go/minipy"
)

// MaxTurns bounds the model's requests in one conversation.
const MaxTurns = 20

// ErrTooManyTurns is the error of a model still calling tools after MaxTurns requests.
var ErrTooManyTurns = errors.New("the model was still calling tools after the last turn")

// Claude sends prompt to the model with minipy as its tool, run with opts (opts.Globals is
// the conversation's namespace), and runs the tool calls it makes until it answers in text.
func Claude(ctx context.Context, client anthropic.Client, model anthropic.Model, opts *minipy.Options, prompt string) (string, error) {
	t := minipy.ToolSchemaFor(opts) // the description lists opts.Globals' host functions, if any
	tools := []anthropic.ToolUnionParam{{OfTool: &anthropic.ToolParam{Name: t.Name, Description: anthropic.String(t.Description),
		InputSchema: anthropic.ToolInputSchemaParam{Properties: t.InputSchema.Properties, Required: t.InputSchema.Required}}}}
	messages := []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock(prompt))}
	for range MaxTurns {
		msg, err := client.Messages.New(ctx, anthropic.MessageNewParams{
			Model: model, MaxTokens: 4096, Messages: messages, Tools: tools,
		})
		if err != nil {
			return "", err
		}
		messages = append(messages, msg.ToParam())
		var answer strings.Builder
		var results []anthropic.ContentBlockParamUnion
		for _, block := range msg.Content {
			switch b := block.AsAny().(type) {
			case anthropic.TextBlock:
				answer.WriteString(b.Text)
			case anthropic.ToolUseBlock:
				r := minipy.ToolResult{Text: "[error]\nThere is no tool named " + b.Name + ".\n", IsError: true}
				if b.Name == minipy.ToolName {
					r = minipy.CallToolResult(ctx, b.Input, opts)
				}
				results = append(results, toolResultBlock(b.ID, r))
			}
		}
		if len(results) == 0 {
			return answer.String(), nil
		}
		messages = append(messages, anthropic.NewUserMessage(results...))
	}
	return "", ErrTooManyTurns
}

// toolResultBlock is the tool_result answering toolUseID: the text, then the images in
// order (the text's "[image N: ...]" is the Nth), as base64 image blocks.
func toolResultBlock(toolUseID string, r minipy.ToolResult) anthropic.ContentBlockParamUnion {
	block := anthropic.NewToolResultBlock(toolUseID, r.Text, r.IsError)
	for _, img := range r.Images {
		image := anthropic.NewImageBlockBase64(img.MIMEType, base64.StdEncoding.EncodeToString(img.Data))
		block.OfToolResult.Content = append(block.OfToolResult.Content, anthropic.ToolResultBlockParamContentUnion{OfImage: image.OfImage})
	}
	return block
}
