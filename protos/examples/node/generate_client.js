// A product backend's client of Tessera's public Generate API (Node.js).
//
// The message and service types are generated at load time from protos/tessera.proto by
// @grpc/proto-loader, so the client always speaks the server's contract; nothing is hand-written.
//
//   npm install
//   node generate_client.js 127.0.0.1:50051 "Say hello." [--image URL] [--n 2] [--max-tokens 16]
//
// Prints one JSON line per chunk ({index, text_delta, token_ids, finish_reason, usage}) and, at
// the end, {"request_id", "texts"}: each choice's whole text. With TESSERA_API_KEY set, sends it
// as "authorization: Bearer <key>". Exits 1 with the gRPC status on stderr when the call fails.
"use strict";

const path = require("path");
const grpc = require("@grpc/grpc-js");
const protoLoader = require("@grpc/proto-loader");

const PROTO = path.join(__dirname, "..", "..", "tessera.proto");

function parseArgs(argv) {
  const [address, text, ...rest] = argv;
  if (!address || text === undefined) {
    throw new Error("usage: generate_client.js ADDRESS TEXT [--image URL] [--n N] [--max-tokens N] [--model NAME]");
  }
  const options = { address, text, images: [], n: 1, maxTokens: 16, model: "" };
  for (let i = 0; i < rest.length; i += 2) {
    const value = rest[i + 1];
    if (rest[i] === "--image") options.images.push(value);
    else if (rest[i] === "--n") options.n = Number(value);
    else if (rest[i] === "--max-tokens") options.maxTokens = Number(value);
    else if (rest[i] === "--model") options.model = value;
    else throw new Error(`unknown option ${rest[i]}`);
  }
  return options;
}

function generateRequest(options) {
  // A chat with one user turn: the images first, then the text.
  const parts = options.images.map((url) => ({ image: { url } }));
  parts.push({ text: options.text });
  return {
    prompt: { chat: { messages: [{ role: "USER", parts: { parts } }] } },
    model: options.model,
    n: options.n,
    sampling: { max_tokens: options.maxTokens, ignore_eos: true },
  };
}

function main() {
  const options = parseArgs(process.argv.slice(2));
  const definition = protoLoader.loadSync(PROTO, { keepCase: true, longs: Number, enums: String, defaults: false, oneofs: true });
  const tessera = grpc.loadPackageDefinition(definition).tessera.v1;
  const client = new tessera.Generate(options.address, grpc.credentials.createInsecure());
  const metadata = new grpc.Metadata();
  if (process.env.TESSERA_API_KEY) metadata.set("authorization", `Bearer ${process.env.TESSERA_API_KEY}`);

  const texts = {};
  let requestId = "";
  const call = client.Generate(generateRequest(options), metadata, { deadline: Date.now() + 120000 });
  call.on("data", (chunk) => {
    const index = chunk.index || 0;
    texts[index] = (texts[index] || "") + chunk.text_delta;
    requestId = chunk.request_id;
    const line = { index, text_delta: chunk.text_delta, token_ids: chunk.token_ids, finish_reason: chunk.finish_reason || null };
    if (chunk.usage) line.usage = chunk.usage;
    console.log(JSON.stringify(line));
  });
  call.on("error", (error) => {
    console.error(`${grpc.status[error.code]}: ${error.details}`);
    process.exitCode = 1;
  });
  call.on("end", () => {
    console.log(JSON.stringify({ request_id: requestId, texts }));
    client.close();
  });
}

main();
