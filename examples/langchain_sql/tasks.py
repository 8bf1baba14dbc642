"""Writes the SQL agent's tasks: `python examples/langchain_sql/tasks.py` (deterministic).

Hand-written questions about the shop database (shop.sql), each with its gold query and whether the
answer's order matters (`ordered`: the question asks for one). Every gold query is run here and must
return rows, and no two questions of a file share an answer (a wrong question's query cannot pass by
luck). Training and validation questions are different questions of the same kinds: filters, joins,
aggregates, grouping, ordering, subqueries.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

HERE = Path(__file__).resolve().parent

# (question, gold query, ordered)
TRAIN = [
    ("List the names of all departments.", "SELECT name FROM departments", False),
    (
        "Which departments are in London?",
        "SELECT name FROM departments WHERE city = 'London'",
        False,
    ),
    ("How many employees are there?", "SELECT COUNT(*) FROM employees", False),
    (
        "Which employees earn more than 100000?",
        "SELECT name FROM employees WHERE salary > 100000",
        False,
    ),
    (
        "Which employees were hired before 2018?",
        "SELECT name FROM employees WHERE hire_year < 2018",
        False,
    ),
    ("What is the highest salary?", "SELECT MAX(salary) FROM employees", False),
    ("What is the total amount of all sales?", "SELECT SUM(amount) FROM sales", False),
    (
        "How many sales were made in the West region?",
        "SELECT COUNT(*) FROM sales WHERE region = 'West'",
        False,
    ),
    (
        "Which employees have the title Engineer?",
        "SELECT name FROM employees WHERE title = 'Engineer'",
        False,
    ),
    (
        "Which employees work in the Marketing department?",
        "SELECT e.name FROM employees e JOIN departments d ON e.department_id = d.id "
        "WHERE d.name = 'Marketing'",
        False,
    ),
    (
        "How many employees does each department have? Give the department name and the count.",
        "SELECT d.name, COUNT(e.id) FROM departments d LEFT JOIN employees e ON e.department_id = d.id "
        "GROUP BY d.id",
        False,
    ),
    (
        "What is the average salary in each department? Give the department name and the average.",
        "SELECT d.name, AVG(e.salary) FROM departments d JOIN employees e ON e.department_id = d.id "
        "GROUP BY d.id",
        False,
    ),
    (
        "List the three highest-paid employees, highest first.",
        "SELECT name FROM employees ORDER BY salary DESC LIMIT 3",
        True,
    ),
    ("List all employees ordered by name.", "SELECT name FROM employees ORDER BY name", True),
    (
        "What is the total sales amount for each product? Give the product and the total.",
        "SELECT product, SUM(amount) FROM sales GROUP BY product",
        False,
    ),
    (
        "Which employee made the largest single sale?",
        "SELECT e.name FROM employees e JOIN sales s ON s.employee_id = e.id ORDER BY s.amount DESC LIMIT 1",
        False,
    ),
    (
        "What is the total sales amount of each employee who made sales? Give the name and the total.",
        "SELECT e.name, SUM(s.amount) FROM employees e JOIN sales s ON s.employee_id = e.id GROUP BY e.id",
        False,
    ),
    (
        "Which employees made no sales at all?",
        "SELECT name FROM employees WHERE id NOT IN (SELECT employee_id FROM sales)",
        False,
    ),
    (
        "Which employees earn more than the average salary?",
        "SELECT name FROM employees WHERE salary > (SELECT AVG(salary) FROM employees)",
        False,
    ),
    (
        "How many sales were made in each region? Give the region and the count.",
        "SELECT region, COUNT(*) FROM sales GROUP BY region",
        False,
    ),
    (
        "Which departments have a budget from 300000 to 600000?",
        "SELECT name FROM departments WHERE budget BETWEEN 300000 AND 600000",
        False,
    ),
    (
        "What is the total salary paid in the Engineering department?",
        "SELECT SUM(e.salary) FROM employees e JOIN departments d ON e.department_id = d.id "
        "WHERE d.name = 'Engineering'",
        False,
    ),
    (
        "In which months of 2024 were Enterprise products sold? List each month once, in order.",
        "SELECT DISTINCT month FROM sales WHERE product = 'Enterprise' ORDER BY month",
        True,
    ),
    (
        "Which employees made more than six sales?",
        "SELECT e.name FROM employees e JOIN sales s ON s.employee_id = e.id GROUP BY e.id "
        "HAVING COUNT(*) > 6",
        False,
    ),
    (
        "What is the name and salary of the lowest-paid employee?",
        "SELECT name, salary FROM employees ORDER BY salary LIMIT 1",
        False,
    ),
    (
        "How many distinct job titles are there?",
        "SELECT COUNT(DISTINCT title) FROM employees",
        False,
    ),
    (
        "Which cities have more than one department?",
        "SELECT city FROM departments GROUP BY city HAVING COUNT(*) > 1",
        False,
    ),
    (
        "What was the total amount of sales in the North region in the second half of 2024 "
        "(July to December)?",
        "SELECT SUM(amount) FROM sales WHERE region = 'North' AND month >= '2024-07'",
        False,
    ),
    (
        "List the employees of the Support department with their salaries, highest salary first.",
        "SELECT e.name, e.salary FROM employees e JOIN departments d ON e.department_id = d.id "
        "WHERE d.name = 'Support' ORDER BY e.salary DESC",
        True,
    ),
    (
        "Which department has the largest budget?",
        "SELECT name FROM departments ORDER BY budget DESC LIMIT 1",
        False,
    ),
    (
        "Which employees sold Pro products? List each name once.",
        "SELECT DISTINCT e.name FROM employees e JOIN sales s ON s.employee_id = e.id "
        "WHERE s.product = 'Pro'",
        False,
    ),
    (
        "Which department's employees made the most sales by total amount? Give its name.",
        "SELECT d.name FROM departments d JOIN employees e ON e.department_id = d.id "
        "JOIN sales s ON s.employee_id = e.id GROUP BY d.id ORDER BY SUM(s.amount) DESC LIMIT 1",
        False,
    ),
]

VAL = [
    (
        "Which departments are in Berlin?",
        "SELECT name FROM departments WHERE city = 'Berlin'",
        False,
    ),
    ("How many departments are there?", "SELECT COUNT(*) FROM departments", False),
    (
        "Which employees earn less than 60000?",
        "SELECT name FROM employees WHERE salary < 60000",
        False,
    ),
    (
        "Which employees were hired in 2024?",
        "SELECT name FROM employees WHERE hire_year = 2024",
        False,
    ),
    ("What is the lowest salary?", "SELECT MIN(salary) FROM employees", False),
    ("What is the average sale amount?", "SELECT AVG(amount) FROM sales", False),
    (
        "Which employees work in the Finance department?",
        "SELECT e.name FROM employees e JOIN departments d ON e.department_id = d.id "
        "WHERE d.name = 'Finance'",
        False,
    ),
    (
        "How many sales did each employee make? Give the name and the count, for employees with sales.",
        "SELECT e.name, COUNT(*) FROM employees e JOIN sales s ON s.employee_id = e.id GROUP BY e.id",
        False,
    ),
    (
        "Which sales were above 11000? Give the seller's name and the amount, largest first.",
        "SELECT e.name, s.amount FROM sales s JOIN employees e ON s.employee_id = e.id "
        "WHERE s.amount > 11000 ORDER BY s.amount DESC",
        True,
    ),
    (
        "What is the total sales amount in each region? Give the region and the total.",
        "SELECT region, SUM(amount) FROM sales GROUP BY region",
        False,
    ),
    (
        "Which employees earn more than the average salary of the Sales department?",
        "SELECT name FROM employees WHERE salary > (SELECT AVG(e.salary) FROM employees e "
        "JOIN departments d ON e.department_id = d.id WHERE d.name = 'Sales')",
        False,
    ),
    (
        "List the departments by budget, largest first.",
        "SELECT name FROM departments ORDER BY budget DESC",
        True,
    ),
]


def records(questions: list[tuple[str, str, bool]], db: sqlite3.Connection) -> list[dict]:
    answers: dict[str, str] = {}
    out = []
    for question, gold, ordered in questions:
        rows = db.execute(gold).fetchall()
        if not rows:
            raise SystemExit(f"no rows for {question!r}")
        key = repr(rows if ordered else sorted(rows, key=repr))
        if key in answers:
            raise SystemExit(f"{question!r} has the same answer as {answers[key]!r}")
        answers[key] = question
        out.append({"question": question, "gold": gold, "ordered": ordered})
    return out


def main() -> None:
    db = sqlite3.connect(":memory:")
    db.executescript((HERE / "shop.sql").read_text())
    for name, questions in [("tasks", TRAIN), ("val", VAL)]:
        rows = records(questions, db)
        (HERE / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        print(f"{name}.jsonl: {len(rows)} tasks")


if __name__ == "__main__":
    main()
