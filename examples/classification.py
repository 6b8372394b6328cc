"""Three-class classification with ``GPClassifier`` and ``method="auto"``.

The data are three overlapping clusters in two dimensions (scikit-learn's
``make_classification``). The script holds out a test set, fits, and prints the test accuracy
next to that of always predicting the most frequent class, then the class probabilities of a
few test points.

    python examples/classification.py                     # 3,000 points, a few minutes
    python examples/classification.py --rows 300          # a few seconds
    python examples/classification.py --method svgp --epochs 20
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from sklearn.datasets import make_classification
from sklearn.model_selection import train_test_split

from gpscale.estimators import GPClassifier


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=3000, help="number of points")
    parser.add_argument("--classes", type=int, default=3, choices=[2, 3])
    parser.add_argument("--method", default="auto", help="a method key (gpscale methods)")
    parser.add_argument("--epochs", type=int, help="most epochs (default: until converged)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("runs/examples/classification"))
    args = parser.parse_args()

    x, y = make_classification(n_samples=args.rows, n_features=2, n_informative=2,
                               n_redundant=0, n_classes=args.classes, n_clusters_per_class=1,
                               class_sep=1.0, random_state=args.seed)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2,
                                                        random_state=args.seed)

    clf = GPClassifier(method=args.method, epochs=args.epochs, random_state=args.seed)
    clf.fit(x_train, y_train)
    proba = clf.predict_proba(x_test)
    accuracy = float(np.mean(clf.classes_[proba.argmax(1)] == y_test))
    majority = float(np.mean(y_test == np.bincount(y_train).argmax()))
    print(f"method: {clf.method_} ({clf.method_reason_})")
    print(f"test accuracy: {accuracy:.4f}")
    print(f"baseline accuracy (most frequent class): {majority:.4f}")
    print("class probabilities of the first test points (columns: classes "
          f"{clf.classes_.tolist()}):")
    for row, label in zip(proba[:5], y_test[:5], strict=True):
        print("  " + "  ".join(f"{p:.3f}" for p in row) + f"   true class {label}")

    args.out.mkdir(parents=True, exist_ok=True)
    np.savetxt(args.out / "test_proba.csv", np.column_stack([proba, y_test]), delimiter=",",
               header=",".join([f"p{c}" for c in clf.classes_] + ["label"]), comments="")
    print(f"wrote {args.out / 'test_proba.csv'}")


if __name__ == "__main__":
    main()
