# %% [markdown]
# # jaxdp quick tour
#
# Differentially private ML in JAX: one shared accountant, mechanisms as pure functions of a
# `jax.random` key, private linear models (jitted/vmapped L-BFGS), DP-SGD for Flax models,
# private prediction with enforced budgets, and empirical audits. Everything here runs on CPU
# in a couple of minutes with the `digits` data embedded in scikit-learn (no download).
#
# In Colab: upload or clone the repository, then `%pip install -e /path/to/jaxdp`.

# %%
import functools

import jax
import jax.numpy as jnp
import numpy as np

import jaxdp
from jaxdp import accounting, audit, data, dpsgd, mechanisms, prediction, training
from jaxdp.models import MLP

print("jaxdp", jaxdp.__version__, "on", jax.devices())

# %% [markdown]
# ## 1. Accounting: DP-SGD epsilon, calibration, and a budget that refuses to be overspent

# %%
q, steps, delta = 256 / 60_000, 3516, 1e-5
print("RDP eps:", accounting.dpsgd_epsilon(1.1, q, steps, delta, accountant="rdp"))
print("PLD eps:", accounting.dpsgd_epsilon(1.1, q, steps, delta, accountant="pld"))
z = accounting.calibrate_noise_multiplier(1.0, delta, q, steps)
print("noise multiplier for eps=1:", z)

budget = accounting.PrivacyBudget(epsilon=1.0)
budget.spend(accounting.PureDpEvent(0.5, neighbouring="replace_one"), count=2)
try:
  budget.spend(accounting.PureDpEvent(0.01, neighbouring="replace_one"))
except accounting.BudgetExceededError as err:
  print("refused:", err)

# %% [markdown]
# ## 2. Mechanisms are pure functions of a key: vmap over keys (and noise scales)

# %%
keys = jax.random.split(jax.random.key(0), 100_000)
laplace = jax.jit(jax.vmap(functools.partial(mechanisms.laplace_mechanism, value=0.0,
                                             l1_sensitivity=1.0, epsilon=1.0)))
draws = laplace(keys)
print("Laplace(b=1) sample std:", float(draws.std()), "(expected sqrt(2) = 1.414)")
print("analytic Gaussian sigma(eps=1, delta=1e-5):", accounting.analytic_gaussian_sigma(1.0, 1e-5))

# %% [markdown]
# ## 3. Private linear models (paper 000 Algorithms 1-5)

# %%
ds = data.load("digits")
x_train = data.normalize_rows(ds.x_train)
x_test = data.normalize_rows(ds.x_test)
acc = accounting.PrivacyAccountant()
for name, method in [("model sensitivity", training.model_sensitivity),
                     ("loss perturbation", training.loss_perturbation)]:
  # tol=1e-5 (scipy's default gtol): noisy objectives have a float32 gradient floor near 1e-6.
  model = method(jax.random.key(1), x_train, ds.y_train, num_classes=10, l2_reg=1e-3,
                 epsilon=10.0, tol=1e-5)
  acc.spend(model.event)
  accuracy = float((training.predict_labels(model.weights, x_test) == ds.y_test).mean())
  print(f"{name}: eps=10 test accuracy {accuracy:.3f}; event {model.event}")
print("total pure epsilon spent:", acc.pure_epsilon())

# One call, 32 noise draws: a vmapped batch of private fits.
batch = training.loss_perturbation(jax.random.split(jax.random.key(2), 32), x_train, ds.y_train,
                                   num_classes=10, l2_reg=1e-3, epsilon=10.0, tol=1e-5)
print("batched weights:", batch.weights.shape)

# %% [markdown]
# ## 4. DP-SGD for a Flax model

# %%
result = dpsgd.train_dpsgd(
    MLP(hidden_sizes=(64,), num_classes=10, activation=jnp.tanh), ds.x_train, ds.y_train,
    key=jax.random.key(3), epochs=5, l2_clip_norm=1.0, delta=1e-5, expected_batch_size=128,
    target_epsilon=3.0, learning_rate=0.5)
mlp_apply = lambda params, x: MLP(hidden_sizes=(64,), num_classes=10,
                                  activation=jnp.tanh).apply({"params": params}, x)
dpsgd_acc = dpsgd.accuracy(mlp_apply, result.params, ds.x_test, ds.y_test)
print(f"DP-SGD: noise multiplier {result.noise_multiplier:.3f}, eps {result.epsilon:.3f} "
      f"after {result.steps} steps; test accuracy {dpsgd_acc:.3f}")

# %% [markdown]
# ## 5. Private prediction with an enforced query budget (subsample-and-aggregate)

# %%
teachers = prediction.train_linear_teachers(x_train, ds.y_train, num_teachers=16, num_classes=10,
                                            l2_reg=1e-2)
predictor = prediction.SubsampleAggregatePredictor.from_linear_teachers(
    teachers.weights, epsilon=1.0, delta=1e-5, budget=50, key=jax.random.key(4))
labels = predictor.predict(x_test[:50])
print("private labels accuracy on 50 queries:", float((np.asarray(labels) == ds.y_test[:50]).mean()))
try:
  predictor.predict(x_test[50:51])
except accounting.BudgetExceededError as err:
  print("query 51 refused:", str(err)[:80], "...")

# %% [markdown]
# ## 6. Audit: an empirical lower bound on epsilon

# %%
pair = audit.cases.scalar_query_pair(sensitivity=1.0)
report = audit.audit_epsilon(
    lambda key, d: mechanisms.laplace_mechanism(key, d, 1.0, 1.0), pair.dataset, pair.neighbour,
    key=jax.random.key(5), num_trials=200_000, claimed_epsilon=1.0, progress=False)
print(report)
