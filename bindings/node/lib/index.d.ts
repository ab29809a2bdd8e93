// TypeScript declarations of the moelite Node.js binding (lib/index.js).

export declare const Status: Readonly<{
  OK: 0; INVALID_ARGUMENT: 1; OUT_OF_MEMORY: 2; FILE_NOT_FOUND: 3; IO: 4; BUFFER_TOO_SMALL: 5;
  SYSTEM_LIMIT: 6; GGUF_BAD_MAGIC: 10; GGUF_BAD_VERSION: 11; GGUF_TRUNCATED: 12; GGUF_CORRUPT: 13;
  GGUF_UNKNOWN_TYPE: 14; GGUF_OUT_OF_BOUNDS: 15; GGUF_OVERLAP: 16; UNSUPPORTED_ARCH: 20;
  UNSUPPORTED_TYPE: 21; MISSING_TENSOR: 22; BAD_SHAPE: 23; MISSING_METADATA: 24; BAD_METADATA: 25;
  BACKEND_UNAVAILABLE: 30; BUDGET_TOO_SMALL: 31; NOT_IMPLEMENTED: 32; BAD_PROFILE: 33; BACKEND: 34;
  CONTEXT_FULL: 40; BAD_TOKEN: 41; ABORTED: 42; PROGRESS_ABORTED: 43; BUSY: 44; BAD_SESSION: 50;
  SESSION_MISMATCH: 51; INTERNAL: 99;
}>;

export declare const Backend: Readonly<{ AUTO: 0; CPU: 1; VULKAN: 2; CUDA: 3 }>;

/** A failed call: `status` is the moelite_status number, `code` its name. */
export declare class MoeliteError extends Error {
  readonly status: number;
  readonly code: string;
  /** The library's message without the code. */
  readonly detail: string;
}

export declare function version(): string;

export interface ModelOptions {
  threads?: number;
  backend?: 'auto' | 'cpu' | 'vulkan' | 'cuda' | number;
  /** Bytes of experts kept in memory, or text the library parses: "2GiB", a share ("25%"), "auto" or "none". */
  budget?: number | bigint | string;
  policy?: 'cyclic' | 'lru' | 'lfu' | 'decay' | 'static' | 'belady';
  predictor?: string;
  /** How the budget is shared among layers. */
  allocation?: 'auto' | 'global' | 'uniform' | 'dp';
  profile?: string;
  /** Adaptive gating; penalty and substitutes apply to cache-aware gating (include/moelite.h). */
  gating?: {
    mode: 'exact' | 'sensitivity' | 'score' | 'cache-aware';
    threshold?: number;
    penalty?: number;
    substitutes?: number;
  };
}

export interface ExpertStats {
  activations: number; hits: number; misses: number;
  prefetchesIssued: number; prefetchesUsed: number; prefetchesWasted: number;
  bytesRead: number; waitSeconds: number; predicted: number; predictions: number;
  readyWhenNeeded: number; routedTokens: number; routedExperts: number; readBusySeconds: number; reads: number;
  hitRate: number;
}

export interface ChatMessage { role: string; content: string }

export declare class Model {
  static load(path: string, opts?: ModelOptions): Model;
  static loadAsync(path: string, opts?: ModelOptions): Promise<Model>;
  close(): void;
  get(key: number): number;
  readonly nVocab: number;
  readonly nLayers: number;
  readonly nCtxTrain: number;
  readonly expertBudget: number;
  /** Expert slots: of the store's pool under a budget, else every routed expert. */
  readonly expertSlots: number;
  readonly nExperts: number;
  readonly nDenseLayers: number;
  readonly arch: string;
  readonly name: string;
  readonly backendName: string;
  tokenize(text: string, opts?: { addSpecial?: boolean; parseSpecial?: boolean }): Int32Array;
  detokenizeBytes(tokens: ArrayLike<number>, opts?: { renderSpecial?: boolean }): Buffer;
  detokenize(tokens: ArrayLike<number>, opts?: { renderSpecial?: boolean }): string;
  isEndToken(token: number): boolean;
  chatFormat(messages: ChatMessage[], addAssistantPrompt?: boolean): string;
  chatTokenize(messages: ChatMessage[], addAssistantPrompt?: boolean): Int32Array;
  expertStats(layer?: number): ExpertStats;
  resetExpertStats(): void;
  traceBegin(path: string): void;
  traceEnd(): void;
}

export interface ContextOptions {
  nCtx?: number; nBatch?: number; nSeq?: number;
  /** The quality meter: the share (0..1) of decode steps compared with exact routing. */
  qualitySample?: number;
  /** The quality governor's target: a perplexity rise ("1%", "0.5%") or "kl:0.01" nats per token. */
  qualityTarget?: string;
  /** The thresholds the governor may use: [min, max]. */
  qualityBounds?: [number, number];
}

/** What lossy gating cost a context (moelite_quality_stats); all 0 with exact gating. */
export interface QualityStats {
  gatedTokens: number; predictedLoss: number; meteredTokens: number;
  /** Mean KL(exact || gated) of the metered tokens, nats per token. */
  klMean: number; klStderr: number; top1Agreement: number; top1Stderr: number;
  predictedLossMetered: number; meterEvaluations: number; meterSeconds: number;
  /** The gating threshold in use now; the governor's target (0: none). */
  threshold: number; targetKl: number; klPerPredicted: number;
}

export interface GenerateParams {
  maxTokens?: number;
  temperature?: number;
  topK?: number;
  topP?: number;
  minP?: number;
  repeatPenalty?: number;
  repeatLastN?: number;
  seed?: number | bigint;
  stop?: string[];
}

export type StopReason = 'end' | 'max_tokens' | 'stop' | 'aborted' | 'context_full' | 'error';

export interface GenerateStats {
  promptTokens: number; cachedTokens: number; generatedTokens: number; stopReason: StopReason;
  promptSeconds: number; generateSeconds: number; timeToFirstTokenSeconds: number;
  promptTokensPerSecond: number; generatedTokensPerSecond: number;
}

export interface GeneratedToken { id: number; text: string }

export interface Generation extends AsyncIterable<GeneratedToken> {
  /** Why it ended; null while it goes on. */
  readonly stopReason: StopReason | null;
}

export declare class Context {
  constructor(model: Model, opts?: ContextOptions);
  close(): void;
  eval(tokens: ArrayLike<number>, opts?: { logitsAll?: boolean }): void;
  evalAsync(tokens: ArrayLike<number>, opts?: { logitsAll?: boolean }): Promise<void>;
  evalBatch(tokens: ArrayLike<number>, seqIds: ArrayLike<number>, wantLogits?: ArrayLike<boolean> | null): void;
  logits(i?: number): Float32Array | null;
  readonly kvLength: number;
  readonly nCtx: number;
  kvReset(): void;
  kvTruncate(nKeep: number): void;
  seqLength(seq: number): number;
  seqTruncate(seq: number, nKeep: number): void;
  tokens(): Int32Array;
  save(path: string): void;
  load(path: string): void;
  expertStats(layer?: number): ExpertStats;
  resetExpertStats(): void;
  qualityStats(): QualityStats;
  generateText(prompt: string, params?: GenerateParams): Promise<{ text: string; stats: GenerateStats }>;
  /** One generation per context at a time: while this iterator runs (first next() to the end of
   *  its loop or return()), other generations and every call that changes the context throw
   *  MoeliteError with Status.BUSY. */
  generate(prompt: string | ArrayLike<number>, params?: GenerateParams & { signal?: AbortSignal }): Generation;
}

export type RequestState = 'waiting' | 'running' | StopReason;

export interface QueueEvent {
  id: number;
  /** The token the request drew in the step; null when none (it ended without one). */
  token: number | null;
  /** What the request's text gained in the step (whole characters, stop strings cut). */
  text: string;
  state: RequestState;
}

/** Requests decoded together by one context's sequences (moelite_queue_*); see lib/index.js. */
export declare class Queue {
  constructor(ctx: Context);
  close(): void;
  add(prompt: string | ArrayLike<number>, params?: GenerateParams & { parseSpecial?: boolean }): number;
  step(): Promise<QueueEvent[]>;
  run(): AsyncIterable<QueueEvent>;
  readonly waiting: number;
  readonly running: number;
  readonly finished: number;
  readonly busy: boolean;
  state(id: number): RequestState;
  /** stopReason is 'waiting' or 'running' until the request ends. */
  stats(id: number): Omit<GenerateStats, 'stopReason'> & { stopReason: RequestState };
  tokens(id: number): Int32Array;
  textBytes(id: number): Buffer;
  text(id: number): string;
  cancel(id: number): void;
  remove(id: number): void;
}
