// Command codemode is "code mode" on anthropic-sdk-go: Go registers its own tools (a small
// orders database and a currency converter) as Python functions in the conversation's
// namespace, and the model calls them from one code block, in a loop, instead of one tool
// call per order. Only what the code prints goes back into the model's context: a summary
// line, not every order.
//
//	ANTHROPIC_API_KEY=... go run ./codemode "What did our shipped orders bring in, in EUR?"
package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"strings"
	"sync"

	"github.com/anthropics/anthropic-sdk-go/v2"

	"github.com/minipy-go/minipy"
	"github.com/minipy-go/minipy/examples/agent"
)

func main() {
	prompt := "What did our shipped orders bring in, in EUR?"
	if len(os.Args) > 1 {
		prompt = strings.Join(os.Args[1:], " ")
	}
	client := anthropic.NewClient() // reads ANTHROPIC_API_KEY
	answer, err := ask(context.Background(), client, anthropic.ModelClaudeSonnet4_5, newShop(), prompt)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(answer)
}

// Order is a row of the shop's orders table.
type Order struct {
	ID       int     `json:"id"`
	Customer string  `json:"customer"`
	Amount   float64 `json:"amount"`
	Currency string  `json:"currency"`
	Status   string  `json:"status"`
}

// OrderQuery is find_orders' arguments: the model sees them as its Python signature.
type OrderQuery struct {
	Customer string `json:"customer,omitempty" jsonschema:"only this customer's orders"`
	Status   string `json:"status,omitempty" jsonschema:"only orders in this status: pending, shipped or cancelled"`
}

// Conversion is convert's arguments.
type Conversion struct {
	Amount float64 `json:"amount"`
	From   string  `json:"from_currency" jsonschema:"ISO code of the amount's currency"`
	To     string  `json:"to_currency" jsonschema:"ISO code of the currency wanted"`
}

// shop is the host's data and the functions the model's code may call; it counts the
// calls (the test checks that the code made them).
type shop struct {
	orders []Order
	rates  map[string]float64 // value of one unit in EUR

	mu    sync.Mutex
	calls map[string]int
}

func newShop() *shop {
	return &shop{
		orders: []Order{
			{1, "ann", 120, "USD", "shipped"},
			{2, "bob", 75.5, "EUR", "pending"},
			{3, "ann", 9800, "JPY", "shipped"},
			{4, "cyd", 42, "GBP", "shipped"},
			{5, "bob", 18, "USD", "cancelled"},
		},
		rates: map[string]float64{"EUR": 1, "USD": 0.92, "GBP": 1.17, "JPY": 0.0061},
		calls: map[string]int{},
	}
}

func (s *shop) count(name string) {
	s.mu.Lock()
	s.calls[name]++
	s.mu.Unlock()
}

// functions are the shop's tools as host functions.
func (s *shop) functions() []minipy.Function {
	find := minipy.Func("find_orders", "Orders of the shop, all or filtered by customer and status.",
		func(_ context.Context, q OrderQuery) ([]Order, error) {
			s.count("find_orders")
			out := []Order{}
			for _, o := range s.orders {
				if (q.Customer == "" || o.Customer == q.Customer) && (q.Status == "" || o.Status == q.Status) {
					out = append(out, o)
				}
			}
			return out, nil
		})
	convert := minipy.Func("convert", "Convert an amount between currencies at today's rate.",
		func(_ context.Context, c Conversion) (float64, error) {
			s.count("convert")
			from, ok := s.rates[c.From]
			if !ok {
				return 0, fmt.Errorf("unknown currency %q", c.From)
			}
			to, ok := s.rates[c.To]
			if !ok {
				return 0, fmt.Errorf("unknown currency %q", c.To)
			}
			return c.Amount * from / to, nil
		})
	return []minipy.Function{find, convert}
}

// ask runs one conversation with the shop's functions registered in its namespace.
func ask(ctx context.Context, client anthropic.Client, model anthropic.Model, s *shop, prompt string) (string, error) {
	ns := minipy.NewNamespace()
	defer ns.Close()
	if err := ns.Register(s.functions()...); err != nil {
		return "", err
	}
	// The tool's description now lists find_orders(...) and convert(...) for the model.
	return agent.Claude(ctx, client, model, &minipy.Options{Globals: ns}, prompt)
}
