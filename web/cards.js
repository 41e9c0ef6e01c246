// The cards with state of their own over a loaded model, registered once, here. Each module exports one `card`: its key
// in main.js's store, how that key is made, drawn and wired, and what each moment of a model's life does to it.
// main.js goes through CARDS at each moment, in this order; a card without a hook is skipped. The worker's side of the
// same idea is lab/worker/cards.py.
//
//   key, fresh()                  store[key] = fresh(), as the page starts; key is also the id of the card's section
//                                 in server/templates/index.html, which web/navigator.js folds and goes to
//   render(store)                 on every render
//   wire(store, worker, page)     once, as the page starts: the card's own event handlers; page: {render, sampling (the
//                                 chat's {settings, max_new}), selectHead(layer, head) (the panels' layer and head)}
//   exports(store, register)      once, as the page starts: its JSON and PNG exports, register(id, ...) as
//                                 web/export.js registerExport
//   loaded(store, stats, worker)  a model was loaded (the "loaded" message's stats)
//   cleared(store, worker)        the conversation was dropped: New chat, Forget, a lost GPU, another file
//   forgetting(store, worker)     Forget, after `cleared`: what a new chat keeps goes too
//   forgotten(store, report)      Forget's report came back (what the wipe read back, buffer by buffer)
//   dropped(store, worker, how)   the model went, after `cleared`: a lost GPU, another file, Forget of a model trained
//                                 here; how {made: true}: the Training card's new model replaces it
//   picked(store, file)           another file was picked, after `dropped`, before its load is asked for
//   opened(store, worker)         the card is open on a loaded model: after a load while it is open, and when it is
//                                 opened (web/navigator.js); what a card asks the worker for by itself it asks here,
//                                 so a folded card asks for nothing
//   changed(store, worker)        what is open or on screen changed, or a turn ended: a card that reads the conversation
//                                 asks for what it now lacks (only while web/navigator.js `computes` it)
//   summary(store)                its current result in one line, shown while it is folded (web/navigator.js)
//
// What a card's own messages mean for the rest of the store (a run that overwrote the KV cache) stays in main.js's
// onWorker and onError, as the worker's routing stays in lab/worker/router.py ROUTES.
// Adding a card: its module with its `card`, and two lines here: its import, and its place in CARDS.
import { card as verify } from "/web/verify.js";
import { card as rope } from "/web/rope.js";
import { card as perplexity } from "/web/perplexity.js";
import { card as retrieval } from "/web/retrieval.js";
import { card as grounded } from "/web/grounded.js";
import { card as router } from "/web/routing.js";
import { card as experiments } from "/web/experiments.js";
import { card as training } from "/web/training.js";
import { card as tokenizer } from "/web/tokenizer.js";

export const CARDS = [verify, rope, router, perplexity, retrieval, grounded, experiments, training, tokenizer];

// Every card's `hook`, in CARDS order, with these arguments.
export function each(hook, ...args) {
  for (const card of CARDS) if (card[hook]) card[hook](...args);
}
