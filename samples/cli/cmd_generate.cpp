// `moelite run` (one completion, streamed) and `moelite chat` (interactive, multi-turn).
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "chat_transcript.h"
#include "cli.h"
#include "harmony_reply.h"

namespace cli {

namespace {

const Command kRunCommand = {"run", "-m MODEL (-p PROMPT | -f FILE) [options]", "Streams a completion of the prompt.",
                             with_groups({{{"-p"}, "PROMPT", "the prompt"},
                                          {{"-f"}, "FILE", "read the prompt from a file"},
                                          {{"-c"}, "CTX", "context length (default: the model's, at most 4096)"},
                                          {{"--session"}, "FILE",
                                           "restore the KV cache from FILE when it exists (a prompt that starts with "
                                           "the saved tokens skips them) and save it there afterwards"}},
                                         {&generate_options(), &quality_options(), &model_options()})};
const Command kChatCommand = {
    "chat", "-m MODEL [--system TEXT] [options]",
    "Interactive multi-turn chat with the model's chat template. When the conversation outgrows the context, the "
    "oldest turns are dropped (the system prompt is kept) and a note says so.",
    with_groups({{{"--system"}, "TEXT", "system prompt"},
                 {{"--template"}, "NAME",
                  "chat template instead of the file's: chatml, mistral, llama3, tulu, harmony (gpt-oss: only the "
                  "final channel is the answer, the reasoning goes to stderr), deepseek2, deepseek3 or plain"},
                 {{"-c"}, "CTX", "context length (default: the model's, at most 4096)"},
                 {{"--session"}, "FILE",
                  "restore the conversation's KV cache from FILE when it exists and save it after each answer"}},
                {&generate_options(), &quality_options(), &model_options()})};
const Command kTokenizeCommand = {"tokenize", "-m MODEL (-p TEXT | -f FILE) [--add-special] [--parse-special]",
                                  "Prints the token ids of a text.",
                                  with_groups({{{"-p"}, "TEXT", "the text"},
                                               {{"-f"}, "FILE", "read the text from a file"},
                                               {{"--add-special"}, "", "add BOS/EOS as the model does"},
                                               {{"--parse-special"}, "", "turn special-token text into its ids"}},
                                              {&model_options()})};

// The last byte written to stdout (0 before any): whether the text ended its line.
char g_last_byte = 0;

// Streams a piece to stdout; stops the generation (returns 0) when stdout cannot take it, since
// nobody will read the rest.
int print_piece(const char* piece, size_t len, void*) {
  if (len) g_last_byte = piece[len - 1];
  return fwrite(piece, 1, len, stdout) == len && fflush(stdout) == 0 ? 1 : 0;
}

void print_stats(const moelite_generate_stats& s, bool on_a_new_line = true) {
  fprintf(stderr, "%s[prompt %d tokens (%d cached) %.1f tok/s | generated %d tokens %.1f tok/s | first token %.0f ms]\n",
          on_a_new_line ? "\n" : "", s.n_prompt_tokens, s.n_cached_tokens, s.prompt_tokens_per_second,
          s.n_generated_tokens, s.generated_tokens_per_second, 1000.0 * s.time_to_first_token_seconds);
}

// Whether two descriptors write to the same file (`> log 2>&1`): then the statistics line must
// start a line of its own after text that did not end one.
bool same_file(int a, int b) {
  struct stat sa, sb;
  return fstat(a, &sa) == 0 && fstat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

// What the experts took and did: how many were held in memory, the store's hit rate and the bytes
// it read per generated token (prompt reads included).
void print_expert_stats(moelite_model* model, int32_t n_generated) {
  const int64_t moe_layers = moelite_model_get(model, MOELITE_MODEL_N_LAYERS) -
                             moelite_model_get(model, MOELITE_MODEL_N_DENSE_LAYERS);
  const int64_t all = moe_layers * moelite_model_get(model, MOELITE_MODEL_N_EXPERTS);
  const double mib = 1048576.0, all_bytes = double(moelite_model_get(model, MOELITE_MODEL_EXPERT_BYTES));
  if (moelite_model_get(model, MOELITE_MODEL_EXPERT_BUDGET) == 0) {
    fprintf(stderr, "[experts: all %" PRId64 " in memory (%.1f MiB), no reads]\n", all, all_bytes / mib);
    return;
  }
  moelite_expert_stats st{};
  st.struct_size = sizeof st;
  moelite_model_expert_stats(model, -1, &st);
  fprintf(stderr,
          "[experts: %" PRId64 " of %" PRId64 " in memory (%.1f of %.1f MiB) | hit rate %.3f | %.2f MB read per "
          "generated token | waited %.0f ms]\n",
          std::min(all, moelite_model_get(model, MOELITE_MODEL_EXPERT_SLOTS)), all,
          double(moelite_model_get(model, MOELITE_MODEL_EXPERT_POOL_BYTES)) / mib, all_bytes / mib,
          st.activations ? double(st.hits) / double(st.activations) : 1.0,
          n_generated > 0 ? double(st.bytes_read) / 1e6 / n_generated : 0.0, 1000.0 * st.wait_seconds);
}

struct Session {
  moelite_model* model = nullptr;
  moelite_context* ctx = nullptr;
  moelite_generate_params* gen = nullptr;
  ~Session() {
    moelite_generate_params_free(gen);
    moelite_context_free(ctx);
    free_model(model);
  }
};

// Model, context and generation parameters from the command line.
int open_session(const Args& args, Session* s) {
  int64_t n_ctx = 0;
  std::string err;
  if (!args.get_int("-c", 0, &n_ctx, &err)) return usage_error(err);
  if (int rc = load_model(args, &s->model)) return rc;
  moelite_context_params* cp = moelite_context_params_create();
  if (int rc = quality_params_from_args(args, cp)) {
    moelite_context_params_free(cp);
    return rc;
  }
  moelite_status st = moelite_context_params_set_n_ctx(cp, static_cast<int32_t>(n_ctx));
  if (st == MOELITE_OK) st = moelite_context_create(s->model, cp, &s->ctx);
  moelite_context_params_free(cp);
  if (st != MOELITE_OK) return report(st, "creating context");
  s->gen = moelite_generate_params_create();
  if (!s->gen) return report(MOELITE_ERR_OUT_OF_MEMORY, "params");
  if (int rc = generate_params_from_args(args, s->gen)) return rc;
  moelite_generate_params_set_callback(s->gen, print_piece, nullptr);
  if (args.has("--session")) {
    const std::string path = args.get("--session");
    st = moelite_context_load(s->ctx, path.c_str());
    if (st == MOELITE_OK)
      fprintf(stderr, "[session: %d tokens restored from %s]\n", moelite_context_kv_length(s->ctx), path.c_str());
    else if (st != MOELITE_ERR_FILE_NOT_FOUND)  // a missing file is a new session
      return report(st, "restoring the session");
  }
  return 0;
}

// Saves the context to --session FILE, if given.
int save_session(const Args& args, const Session& s) {
  if (!args.has("--session")) return 0;
  const moelite_status st = moelite_context_save(s.ctx, args.get("--session").c_str());
  return st == MOELITE_OK ? 0 : report(st, "saving the session");
}

}  // namespace

int generate_params_from_args(const Args& a, moelite_generate_params* p) {
  std::string err;
  int64_t n, top_k, last_n, seed;
  double temp, top_p, min_p, rep;
  if (!a.get_int("-n", 256, &n, &err) || !a.get_int("--top-k", 40, &top_k, &err) ||
      !a.get_int("--repeat-last-n", 64, &last_n, &err) ||
      !a.get_int("--seed", 0x5eed, &seed, &err, INT64_MIN, INT64_MAX) ||  // a 64-bit seed
      !a.get_double("--temp", 0.8, &temp, &err) || !a.get_double("--top-p", 0.95, &top_p, &err) ||
      !a.get_double("--min-p", 0.05, &min_p, &err) || !a.get_double("--repeat-penalty", 1.0, &rep, &err))
    return usage_error(err);
  moelite_status st = moelite_generate_params_set_max_tokens(p, static_cast<int32_t>(n));
  if (st == MOELITE_OK) st = moelite_generate_params_set_temperature(p, static_cast<float>(temp));
  if (st == MOELITE_OK) st = moelite_generate_params_set_top_k(p, static_cast<int32_t>(top_k));
  if (st == MOELITE_OK) st = moelite_generate_params_set_top_p(p, static_cast<float>(top_p));
  if (st == MOELITE_OK) st = moelite_generate_params_set_min_p(p, static_cast<float>(min_p));
  if (st == MOELITE_OK)
    st = moelite_generate_params_set_repeat_penalty(p, static_cast<float>(rep), static_cast<int32_t>(last_n));
  if (st == MOELITE_OK) st = moelite_generate_params_set_seed(p, static_cast<uint64_t>(seed));
  for (const std::string& stop : a.get_all("--stop"))
    if (st == MOELITE_OK) st = moelite_generate_params_add_stop(p, stop.c_str());
  return st == MOELITE_OK ? 0 : report(st, "generation options");
}

int cmd_run(int argc, char** argv) {
  Args args;
  if (int rc = 0; !parse_command_line(argc, argv, kRunCommand, &args, &rc)) return rc;
  if (!args.has("-p") && !args.has("-f")) return usage_error("missing -p PROMPT (or -f FILE)");
  std::string prompt = args.get("-p");
  if (args.has("-f")) {
    if (std::string why; !read_file(args.get("-f"), &prompt, &why)) return usage_error(why);
  }
  Session s;
  if (int rc = open_session(args, &s)) return rc;
  moelite_generate_stats stats{};
  stats.struct_size = sizeof stats;
  moelite_status st = moelite_generate(s.ctx, prompt.data(), prompt.size(), s.gen, &stats);
  if (st != MOELITE_OK) return report(st, "generating");
  if (stats.stop_reason == MOELITE_STOP_ABORTED) return finish_output(0);  // stdout is gone: says so, exit 1
  // On a terminal the text ends its line; into a file or a pipe it stays exactly what was generated.
  const bool open_line = g_last_byte != 0 && g_last_byte != '\n';
  if (open_line && isatty(STDOUT_FILENO)) {
    fputc('\n', stdout);
    fflush(stdout);
  }
  print_stats(stats, open_line && !isatty(STDOUT_FILENO) && same_file(STDOUT_FILENO, STDERR_FILENO));
  print_expert_stats(s.model, stats.n_generated_tokens);
  print_quality(s.ctx);
  return save_session(args, s);
}

namespace {

struct Conversation {
  std::vector<std::string> roles, contents;
  size_t n_fixed = 0;  // leading messages never dropped (the system prompt)

  // The conversation's tokens: typed text stays text (a message spelling "<|im_end|>" is not a
  // turn marker), markers come from the template only.
  moelite_status tokenize(moelite_model* model, std::vector<int32_t>* out) const {
    std::vector<moelite_chat_message> msgs;
    for (size_t i = 0; i < roles.size(); ++i) msgs.push_back({roles[i].c_str(), contents[i].c_str()});
    int32_t n = 0;
    moelite_status st = moelite_chat_tokenize(model, msgs.data(), msgs.size(), 1, nullptr, 0, &n);
    out->assign(static_cast<size_t>(n), 0);
    if (st == MOELITE_ERR_BUFFER_TOO_SMALL) st = moelite_chat_tokenize(model, msgs.data(), msgs.size(), 1, out->data(), n, &n);
    return st;
  }
};

// Formats the conversation so that it and `reply_room` tokens fit the context, dropping the
// oldest turns after the fixed ones (a user message with its answer at a time). Says on stderr
// what it dropped. MOELITE_ERR_CONTEXT_FULL when even the newest message alone does not fit.
moelite_status fit_conversation(moelite_model* model, int32_t n_ctx, int32_t reply_room, Conversation* c,
                                std::vector<int32_t>* prompt) {
  size_t dropped = 0;
  for (;;) {
    if (moelite_status st = c->tokenize(model, prompt)) return st;
    const int32_t n = static_cast<int32_t>(prompt->size());
    if (n + reply_room <= n_ctx || c->roles.size() <= c->n_fixed + 1) {
      if (dropped)
        fprintf(stderr, "[context full: dropped the %zu oldest message%s; %d of %d tokens in use]\n", dropped,
                dropped == 1 ? "" : "s", n, n_ctx);
      if (n >= n_ctx) {
        fprintf(stderr, "[this message has %d tokens with the conversation's fixed part; the context holds %d]\n", n,
                n_ctx);
        return MOELITE_ERR_CONTEXT_FULL;
      }
      return MOELITE_OK;
    }
    // Drop the oldest turn: a user message and the answer that follows it.
    size_t end = c->n_fixed + 1;
    if (end < c->roles.size() - 1 && c->roles[end] == "assistant") ++end;
    c->roles.erase(c->roles.begin() + static_cast<std::ptrdiff_t>(c->n_fixed),
                   c->roles.begin() + static_cast<std::ptrdiff_t>(end));
    c->contents.erase(c->contents.begin() + static_cast<std::ptrdiff_t>(c->n_fixed),
                      c->contents.begin() + static_cast<std::ptrdiff_t>(end));
    dropped += end - c->n_fixed;
  }
}

}  // namespace

int cmd_chat(int argc, char** argv) {
  Args args;
  if (int rc = 0; !parse_command_line(argc, argv, kChatCommand, &args, &rc)) return rc;
  std::string err;
  int64_t max_tokens = 256;
  if (!args.get_int("-n", 256, &max_tokens, &err)) return usage_error(err);
  Session s;
  if (int rc = open_session(args, &s)) return rc;
  const bool interactive = isatty(STDIN_FILENO);
  const int32_t n_ctx = moelite_context_n_ctx(s.ctx);
  // Room kept for the answer when old turns must go: the -n limit, but at most half the context.
  const int32_t reply_room = static_cast<int32_t>(std::min<int64_t>(std::max<int64_t>(max_tokens, 0), n_ctx / 2));
  Conversation conv;
  // With --session, the conversation saved beside it comes back, so the next turn's prompt starts
  // with the restored tokens and reuses them (chat_transcript.h).
  const std::string transcript = args.has("--session") ? transcript_path(args.get("--session")) : "";
  if (!transcript.empty()) {
    ChatTranscript saved;
    std::string why;
    const TranscriptStatus ts = load_transcript(transcript, &saved, &why);
    if (ts == TranscriptStatus::Invalid)
      return fprintf(stderr, "moelite: error: %s (move it away to start a new conversation)\n", why.c_str()), 1;
    if (ts == TranscriptStatus::Loaded) {
      conv.roles = saved.roles;
      conv.contents = saved.contents;
      conv.n_fixed = !conv.roles.empty() && conv.roles[0] == "system" ? 1 : 0;
      fprintf(stderr, "[session: conversation of %zu messages restored from %s]\n", conv.roles.size(),
              transcript.c_str());
      for (size_t i = conv.n_fixed; i < conv.roles.size(); ++i) {  // a reminder of where it stood
        const std::string& c = conv.contents[i];
        fprintf(stderr, "  %s: %.*s%s\n", conv.roles[i].c_str(), static_cast<int>(std::min<size_t>(c.size(), 120)),
                c.c_str(), c.size() > 120 ? "..." : "");
      }
    } else if (moelite_context_kv_length(s.ctx) > 0) {
      fprintf(stderr, "[session: %s holds tokens but no conversation (no %s): the chat starts anew and its first "
                      "turn replaces them]\n", args.get("--session").c_str(), transcript.c_str());
    }
  }
  if (args.has("--system")) {
    if (conv.n_fixed == 1 && conv.contents[0] != args.get("--system"))
      fprintf(stderr, "[--system replaces the restored conversation's system message]\n");
    if (conv.n_fixed == 0) {
      conv.roles.insert(conv.roles.begin(), "system");
      conv.contents.insert(conv.contents.begin(), "");
      conv.n_fixed = 1;
    }
    conv.contents[0] = args.get("--system");
  }
  if (std::string(moelite_chat_template_kind(s.model)) == "plain") moelite_generate_params_add_stop(s.gen, "\nuser:");
  const bool harmony = std::string(moelite_chat_template_kind(s.model)) == "harmony";
  if (interactive)
    fprintf(stderr, "chat template: %s. Type a message; /reset forgets the conversation, /exit quits.\n",
            moelite_chat_template_kind(s.model));
  std::string line;
  for (;;) {
    if (interactive) fprintf(stderr, "> ");
    if (!std::getline(std::cin, line)) break;
    if (line == "/exit") break;
    if (line == "/reset") {
      conv.roles.resize(conv.n_fixed);
      conv.contents.resize(conv.n_fixed);
      moelite_context_kv_reset(s.ctx);
      continue;
    }
    if (line.empty()) continue;
    conv.roles.push_back("user");
    conv.contents.push_back(line);
    std::vector<int32_t> prompt;
    moelite_status st = fit_conversation(s.model, n_ctx, reply_room, &conv, &prompt);
    if (st == MOELITE_ERR_CONTEXT_FULL) {  // this message cannot be answered; the chat goes on
      conv.roles.pop_back();
      conv.contents.pop_back();
      continue;
    }
    if (st != MOELITE_OK) return report(st, "formatting the chat");
    // The reply is captured as it streams so the next turn can include it; a harmony reply
    // (gpt-oss) is split into its channels, and only the final one is the answer.
    struct Capture {
      std::string text;
      moelite_model* model;
      moelite_cli::HarmonyReply harmony;
    } cap;
    cap.model = s.model;
    if (harmony) {
      moelite_generate_params_set_callback(s.gen, nullptr, nullptr);
      moelite_generate_params_set_token_callback(
          s.gen,
          [](int32_t token, const char* piece, size_t n, void* user) {
            auto* c = static_cast<Capture*>(user);
            const char* marker = nullptr;
            if (token >= 0 &&
                (moelite_token_attrs(c->model, token) & (MOELITE_TOKEN_ATTR_CONTROL | MOELITE_TOKEN_ATTR_USER_DEFINED))) {
              const char* t = moelite_token_text(c->model, token);
              if (t && moelite_cli::HarmonyReply::is_marker(t)) marker = t;
            }
            switch (c->harmony.feed(marker, piece, n)) {
              case moelite_cli::HarmonyReply::Part::Answer: return print_piece(piece, n, nullptr);
              case moelite_cli::HarmonyReply::Part::Thinking: fwrite(piece, 1, n, stderr); return 1;
              case moelite_cli::HarmonyReply::Part::Hidden: return 1;
            }
            return 1;
          },
          &cap);
    } else {
      moelite_generate_params_set_callback(
          s.gen,
          [](const char* piece, size_t n, void* user) {
            static_cast<Capture*>(user)->text.append(piece, n);
            return print_piece(piece, n, nullptr);
          },
          &cap);
    }
    moelite_generate_stats stats{};
    stats.struct_size = sizeof stats;
    st = moelite_generate_tokens(s.ctx, prompt.data(), static_cast<int32_t>(prompt.size()), s.gen, &stats);
    // A full context ends this answer (what it said so far stands); older turns go next time.
    if (st != MOELITE_OK && st != MOELITE_ERR_CONTEXT_FULL) return report(st, "generating");
    if (stats.stop_reason == MOELITE_STOP_ABORTED) return finish_output(0);  // stdout is gone: says so, exit 1
    printf("\n");
    if (st == MOELITE_ERR_CONTEXT_FULL)
      fprintf(stderr, "[the answer filled the context; older turns will be dropped]\n");
    print_stats(stats);  // on stderr: the conversation on stdout stays clean
    print_quality(s.ctx);
    conv.roles.push_back("assistant");
    conv.contents.push_back(harmony ? cap.harmony.answer() : cap.text);
    if (int rc = save_session(args, s)) return rc;
    if (!transcript.empty()) {
      std::string why;
      if (!save_transcript(transcript, ChatTranscript{conv.roles, conv.contents}, &why))
        return fprintf(stderr, "moelite: error: saving the conversation: %s\n", why.c_str()), 1;
    }
  }
  return 0;
}

int cmd_tokenize(int argc, char** argv) {
  Args args;
  if (int rc = 0; !parse_command_line(argc, argv, kTokenizeCommand, &args, &rc)) return rc;
  std::string text;
  if (args.has("-f")) {
    if (std::string why; !read_file(args.get("-f"), &text, &why)) return usage_error(why);
  } else if (args.has("-p")) {
    text = args.get("-p");
  } else {
    return usage_error("missing -p TEXT or -f FILE");
  }
  moelite_model* model = nullptr;
  if (int rc = load_model(args, &model, /*vocab_only=*/true)) return rc;
  uint32_t flags = (args.has("--add-special") ? MOELITE_TOKENIZE_ADD_SPECIAL : 0) |
                   (args.has("--parse-special") ? MOELITE_TOKENIZE_PARSE_SPECIAL : 0);
  int32_t n = 0;
  std::vector<int32_t> ids(text.size() + 8);
  moelite_status st =
      moelite_tokenize(model, text.data(), text.size(), flags, ids.data(), static_cast<int32_t>(ids.size()), &n);
  if (st == MOELITE_ERR_BUFFER_TOO_SMALL) {
    ids.resize(static_cast<size_t>(n));
    st = moelite_tokenize(model, text.data(), text.size(), flags, ids.data(), n, &n);
  }
  free_model(model);
  if (st != MOELITE_OK) return report(st, "tokenizing");
  for (int32_t i = 0; i < n; ++i) printf("%s%d", i ? " " : "", ids[static_cast<size_t>(i)]);
  printf("\n");
  return 0;
}

}  // namespace cli
