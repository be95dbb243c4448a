// The official OpenAI Node SDK against a running sluice: one completion and one streaming chat.
// Usage: node smoke.mjs BASE_URL MODEL; prints one JSON line with what it got.
import OpenAI from "openai";

const [baseURL, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "sk-not-checked", maxRetries: 0, timeout: 120_000 });

const completion = await client.completions.create({
  model,
  prompt: "The capital of France is",
  max_tokens: 4,
  temperature: 0,
});

const stream = await client.chat.completions.create({
  model,
  messages: [{ role: "user", content: "What is the capital of Japan?" }],
  max_tokens: 32,
  temperature: 0,
  stream: true,
  stream_options: { include_usage: true },
});
let content = "";
let role = null;
let finishReason = null;
let usage = null;
for await (const chunk of stream) {
  if (chunk.usage) usage = chunk.usage;
  for (const choice of chunk.choices) {
    role = role ?? choice.delta.role ?? null;
    content += choice.delta.content ?? "";
    finishReason = choice.finish_reason ?? finishReason;
  }
}

console.log(
  JSON.stringify({
    completion: completion.choices[0].text,
    completionFinish: completion.choices[0].finish_reason,
    completionUsage: completion.usage,
    role,
    content,
    finishReason,
    usage,
  }),
);
